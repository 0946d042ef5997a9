// Admission: what a message does to its conversation, decided and written in one transaction.
// The ledger reads the conversation under its row lock and writes the plan; the pure planner
// (domain/interrupt.ts) decides; a new request that can start at once goes straight to an idle
// worker of this process (early-start.ts).
import { randomUUID } from "node:crypto";
import type { AgentSpec } from "../domain/agent.js";
import { planAdmission } from "../domain/interrupt.js";
import { hasFastModel } from "../domain/triage.js";
import type { AdmissionLedger, ConversationLedger, IncomingMessage, StartClaim } from "./admission-ledger.js";
import { applyPlan, freshClaim, insertNewRequest, withNote, type Mailroom } from "./admission-writes.js";
import { conversationState, startsAtOnce } from "./conversation-state.js";
import { EarlyStart } from "./early-start.js";
import { admitEdit, admitContinuation } from "./follow-ups.js";
import { ConcurrentMessageError, type Admission, type AdmissionAnswers, type AdmissionAttempt, type Admissions, type SubmittedMessage } from "./ingress.js";
import type { Triager } from "./side-calls.js";
import type { WorkerHandoff } from "./worker-handoff.js";

/** What an admission holds beyond its transaction: the early start, and the request to triage after it commits. */
interface Holder {
  start?: EarlyStart;
  triage?: { readonly agent: AgentSpec; readonly text: string } | undefined;
  /** A root whose running WorkGraph the message amended. */
  revised?: string | undefined;
}

export interface AdmissionDeps {
  readonly ledger: AdmissionLedger;
  /** Idle workers of this process; without it every run is queued and a worker woken. */
  readonly handoff?: WorkerHandoff;
  /** The fast model's triage of each new request, started once the admission commits. */
  readonly triage?: Triager;
  /**
   * Told, once the admission commits, of a root whose running WorkGraph a message amended, so its
   * scheduler revises the graph at once (the scheduler's sweep finds it otherwise).
   */
  readonly graphAmended?: (rootRunId: string) => void;
}

const done = <T>(result: T): AdmissionAttempt<T> => ({ kind: "done", result });
const isDone = (attempt: AdmissionAttempt<unknown>): boolean => attempt.kind === "done";

export function createAdmissions(deps: AdmissionDeps): Admissions {
  /**
   * Agents whose last start here was refused by a ceiling: not started early again until a start
   * succeeds, so an agent at its ceiling does not send the provider a call to abort per message.
   */
  const atCeiling = new Set<string>();

  /** A new request started for a reserved worker, or queued when a ceiling says wait. */
  async function startNewRequest(room: Mailroom, incoming: IncomingMessage, why: string, start: EarlyStart): Promise<Admission> {
    const runId = randomUUID();
    // The worker starts before the run is written: its first model call (replayable inference)
    // overlaps the insert and the commit. It goes first, as the call is what a reply waits on.
    const early = !atCeiling.has(room.agent.id);
    if (early) {
      start.handOver(freshClaim(room, incoming, runId));
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    const claim: StartClaim = { workerId: start.workerId, leaseMs: start.leaseMs };
    const started = await insertNewRequest(room, incoming, why, runId, claim);
    if (!started) {
      atCeiling.add(room.agent.id);
      start.notStarted(runId);
    } else {
      atCeiling.delete(room.agent.id);
      if (!early) start.handOver(freshClaim(room, incoming, runId));
    }
    return { runId, status: "queued", duplicate: false };
  }

  async function attemptAdmit(ledger: ConversationLedger, message: SubmittedMessage, answers: AdmissionAnswers, now: Date, holder: Holder) {
    holder.triage = undefined;
    holder.revised = undefined;
    const stored = await ledger.storeMessage(message);
    if (stored.kind === "duplicate") return done<Admission>({ runId: stored.runId, status: stored.status, duplicate: true });
    if (stored.kind === "concurrent") throw new ConcurrentMessageError(message.messageId);
    const { runs, earlierProgress } = stored;
    const room: Mailroom = { ledger, agent: stored.agent, conversationId: stored.conversationId, externalConversationId: message.conversationId, now, earlierProgress };
    const incoming: IncomingMessage = {
      rowId: stored.messageRowId,
      externalId: message.messageId,
      actorId: message.actorId,
      connector: message.connector,
      text: message.text,
      relationLabel: "refines",
    };
    const { state, target } = conversationState(runs);
    const plan = planAdmission({
      state,
      actorId: message.actorId,
      scope: room.agent.interrupt.scope,
      settings: room.agent.interrupt,
      now,
      ...(answers.relation !== undefined && answers.relation.runId === state.target?.runId ? { relation: answers.relation.relation } : {}),
      ...(answers.consent !== undefined && answers.consent.runId === state.exhausted?.runId ? { consent: answers.consent.answer } : {}),
    });
    if (plan.kind === "needs_relation") {
      return { kind: "needs_relation", agent: room.agent, runId: plan.runId, request: target?.requestText ?? "" } as const;
    }
    if (plan.kind === "needs_consent") return { kind: "needs_consent", agent: room.agent, runId: plan.runId } as const;
    const note = answers.relation?.note ?? answers.consent?.note;
    // Only a fast model's triage comes after the admission; without one it is written with the run.
    if (plan.kind === "new_request" && hasFastModel(room.agent)) holder.triage = { agent: room.agent, text: message.text };
    if (plan.kind === "new_request" && deps.handoff !== undefined && startsAtOnce(room.agent.interrupt, runs, now)) {
      const reserved = deps.handoff.reserve();
      if (reserved !== undefined) {
        holder.start = new EarlyStart(reserved);
        return done(await startNewRequest(room, incoming, withNote(plan.why, note), holder.start));
      }
    }
    if (plan.kind === "amend" && target?.id === plan.runId && target.graphRunning) holder.revised = plan.runId;
    return done(await applyPlan(room, plan, incoming, runs, note));
  }

  return {
    async admit(message, answers, now) {
      const holder: Holder = {};
      let attempt: AdmissionAttempt<Admission>;
      try {
        attempt = await deps.ledger.attempt((ledger) => attemptAdmit(ledger, message, answers, now, holder), isDone);
      } catch (error) {
        holder.start?.failed(error);
        throw error;
      }
      holder.start?.committed();
      // Started only now: the early start and the commit never wait for it, and a rolled-back
      // admission never triages a run that does not exist.
      if (attempt.kind === "done" && !attempt.result.duplicate && holder.triage !== undefined) {
        deps.triage?.start(attempt.result.runId, holder.triage.agent, holder.triage.text);
      }
      if (attempt.kind === "done" && holder.revised !== undefined) deps.graphAmended?.(holder.revised);
      return attempt;
    },
    edit: (edit, now) => deps.ledger.attempt((ledger) => admitEdit(ledger, edit, now), () => true),
    continueRun: (request, answers, now) => deps.ledger.attempt((ledger) => admitContinuation(ledger, request, answers, now), isDone),
  };
}
