// The mailbox: every message addressed to an agent in a conversation comes through here.
// The ledger decides and applies each message in one transaction; when the decision needs a
// model's answer (how a follow-up relates to the run in flight, whether a reply consents to
// continuing), the mailbox asks outside any transaction and tries again with the answer.
import type { Logger } from "pino";
import type { AgentSpec, ModelProviderName, ModelSpec } from "../domain/agent.js";
import type { Clock } from "../domain/clock.js";
import { UnavailableError } from "../domain/errors.js";
import {
  CONSENT_ANSWERS,
  CONSENT_FALLBACK,
  consentQuestion,
  FOLLOW_UP_DECISION_TIMEOUT_MS,
  FOLLOW_UP_FALLBACK,
  FOLLOW_UP_RELATIONS,
  followUpQuestion,
} from "../domain/interrupt.js";
import { decide, type DecisionCall } from "../models/decision.js";
import type { ModelProvider } from "../models/model-provider.js";
import { ConcurrentMessageError, type AdmissionAnswers, type AdmissionAttempt, type Admissions, type Mailbox } from "./ingress.js";
import { sideCall, type SideCallLedger } from "./side-calls.js";

export interface MailboxDeps {
  readonly admissions: Admissions;
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly clock: Clock;
  readonly log: Logger;
  /** Where each question's model call is recorded and counted against the run it is about. */
  readonly sideCalls?: SideCallLedger;
}

/** Attempts with fresh answers before the safe defaults settle a conversation that keeps changing. */
const MAX_ASKED_ATTEMPTS = 3;
/** Past this, the caller is told to retry rather than the mailbox spinning on a churning conversation. */
const MAX_ATTEMPTS = 8;

export function createMailbox(deps: MailboxDeps): Mailbox {
  const timeoutOf = (spec: ModelSpec): number => Math.min(spec.timeoutMs > 0 ? spec.timeoutMs : FOLLOW_UP_DECISION_TIMEOUT_MS, FOLLOW_UP_DECISION_TIMEOUT_MS);

  /**
   * Records a question's call against the run it is about (the run in flight, or the exhausted
   * one), so it shows in model_calls and counts against that run's budget. A failure to record
   * is logged: the message is still placed.
   */
  const record = (runId: string, spec: ModelSpec, purpose: "follow_up" | "consent", call: DecisionCall): Promise<void> =>
    deps.sideCalls === undefined
      ? Promise.resolve()
      : deps.sideCalls.recordSideCall(sideCall(runId, spec, "decision", purpose, call)).catch((error: unknown) => {
          deps.log.warn({ err: error, runId }, "a decision call could not be recorded");
        });

  /** The fast model's relation; a slow, failing or off-list answer is the documented fallback. */
  const classify = async (runId: string, agent: AgentSpec, request: string, followUp: string, signal: AbortSignal) => {
    const spec = agent.models.fast;
    const answer = await decide(
      deps.providers[spec.provider],
      spec,
      { question: followUpQuestion(request, followUp), choices: FOLLOW_UP_RELATIONS, fallback: FOLLOW_UP_FALLBACK, timeoutMs: timeoutOf(spec) },
      signal,
    );
    await record(runId, spec, "follow_up", answer.call);
    if (answer.fellBack !== undefined) deps.log.info({ agentId: agent.id, reason: answer.fellBack }, "follow-up classification fell back");
    return { relation: answer.choice, note: answer.fellBack === undefined ? `fast model: ${answer.choice}` : `fast model fell back to ${answer.choice}: ${answer.fellBack}` };
  };

  /** The decision model on a reply to the continuation question; anything but a clear answer is "unclear". */
  const askConsent = async (runId: string, agent: AgentSpec, reply: string, signal: AbortSignal) => {
    const spec = agent.models.decision;
    const answer = await decide(
      deps.providers[spec.provider],
      spec,
      { question: consentQuestion(reply), choices: CONSENT_ANSWERS, fallback: CONSENT_FALLBACK, timeoutMs: timeoutOf(spec) },
      signal,
    );
    await record(runId, spec, "consent", answer.call);
    return { answer: answer.choice, note: answer.fellBack === undefined ? `decision model: ${answer.choice}` : `decision model fell back to ${answer.choice}: ${answer.fellBack}` };
  };

  async function settle<T>(text: string, signal: AbortSignal, attempt: (answers: AdmissionAnswers) => Promise<AdmissionAttempt<T>>): Promise<T> {
    let answers: AdmissionAnswers = {};
    for (let i = 0; ; i++) {
      const outcome = await retryingRaces(() => attempt(answers));
      if (outcome.kind === "done") return outcome.result;
      if (i >= MAX_ATTEMPTS) throw new UnavailableError("the conversation changed on every attempt to place this message; retry it");
      if (i >= MAX_ASKED_ATTEMPTS) {
        // The conversation changed under every answer; the fallbacks are safe whatever the target.
        answers = {
          relation: { runId: outcome.runId, relation: FOLLOW_UP_FALLBACK, note: "the conversation kept changing; fallback" },
          consent: { runId: outcome.runId, answer: CONSENT_FALLBACK, note: "the conversation kept changing; fallback" },
        };
        continue;
      }
      if (outcome.kind === "needs_relation") {
        const { relation, note } = await classify(outcome.runId, outcome.agent, outcome.request, text, signal);
        answers = { ...answers, relation: { runId: outcome.runId, relation, note } };
      } else {
        const { answer, note } = await askConsent(outcome.runId, outcome.agent, text, signal);
        answers = { ...answers, consent: { runId: outcome.runId, answer, note } };
      }
    }
  }

  return {
    submitMessage: (message, signal) => settle(message.text, signal, (answers) => deps.admissions.admit(message, answers, deps.clock.now())),
    editMessage: (edit) => retryingRaces(() => deps.admissions.edit(edit, deps.clock.now())),
    continueRun: (request, signal) => settle(request.text, signal, (answers) => deps.admissions.continueRun(request, answers, deps.clock.now())),
  };
}

/**
 * Two transactions racing on one message id or one continuation: the loser's unique-key
 * violation rolls it back, and trying again finds what the winner wrote.
 */
async function retryingRaces<T>(work: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await work();
    } catch (error) {
      if (attempt >= 2 || !isRace(error)) throw error;
    }
  }
}

function isRace(error: unknown): boolean {
  if (error instanceof ConcurrentMessageError) return true;
  const code = (error as { code?: unknown } | undefined)?.code;
  return code === "23505" || code === "40P01";
}
