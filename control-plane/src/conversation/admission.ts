// Admission: what a message does to its conversation, decided and written in one transaction.
// The ledger reads the conversation under its row lock and writes the plan; the pure planner
// (domain/interrupt.ts) decides; a new request that can start at once goes straight to an idle
// worker of this process (early-start.ts). To a conversation this process last saw quiet, it goes
// before the read, on that guess (quiet-conversations.ts); the read confirms or withdraws it.
import { randomUUID } from "node:crypto";
import type { AgentSpec } from "../domain/agent.js";
import { planAdmission } from "../domain/interrupt.js";
import { hasFastModel } from "../domain/triage.js";
import type { AdmissionLedger, ConversationLedger, IncomingMessage, StartClaim } from "./admission-ledger.js";
import { applyPlan, freshClaim, insertNewRequest, withNote, type Mailroom } from "./admission-writes.js";
import { conversationState, isLive, startsAtOnce } from "./conversation-state.js";
import { EarlyStart } from "./early-start.js";
import { admitEdit, admitContinuation } from "./follow-ups.js";
import { ConcurrentMessageError, type Admission, type AdmissionAnswers, type AdmissionAttempt, type Admissions, type SubmittedMessage } from "./ingress.js";
import { QuietConversations, type QuietView } from "./quiet-conversations.js";
import type { Triager } from "./side-calls.js";
import type { WorkerHandoff } from "./worker-handoff.js";

/** A new request's run handed to a worker before its conversation was read, on the guess that it is still quiet. */
interface Guess {
  readonly start: EarlyStart;
  readonly runId: string;
  readonly view: QuietView;
}

/** What an admission holds beyond its transaction: the early start, and the request to triage after it commits. */
interface Holder {
  start?: EarlyStart;
  /** A guess the read has not confirmed yet; withdrawn unless it is. */
  guess?: Guess | undefined;
  /** What the read saw, remembered once the admission commits: the view and the root runs live. */
  seen?: { readonly view: QuietView; readonly live: readonly string[] } | undefined;
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
  /** What this process last knew of its conversations; without it nothing is started before the read. */
  readonly quiet?: QuietConversations;
}

/** The message as a run's trigger; its row id is known once the admission stored it. */
const incomingOf = (message: SubmittedMessage): Omit<IncomingMessage, "rowId"> => ({
  externalId: message.messageId,
  actorId: message.actorId,
  connector: message.connector,
  text: message.text,
  relationLabel: "refines",
});

const done = <T>(result: T): AdmissionAttempt<T> => ({ kind: "done", result });
const isDone = (attempt: AdmissionAttempt<unknown>): boolean => attempt.kind === "done";

export function createAdmissions(deps: AdmissionDeps): Admissions {
  /**
   * Agents whose last start here was refused by a ceiling: not started early again until a start
   * succeeds, so an agent at its ceiling does not send the provider a call to abort per message.
   */
  const atCeiling = new Set<string>();

  /**
   * The first call of a message to a conversation this process last saw quiet, started before the
   * admission reads it: the read's round trip then overlaps the call instead of preceding it. Not
   * for an answer to a question, a message this process admitted lately, or an agent at its ceiling.
   */
  function guessStart(message: SubmittedMessage, answers: AdmissionAnswers, now: Date): Guess | undefined {
    const quiet = deps.quiet;
    if (quiet === undefined || deps.handoff === undefined) return undefined;
    if (answers.relation !== undefined || answers.consent !== undefined || atCeiling.has(message.agentId)) return undefined;
    const view = quiet.quiet(message.agentId, message.conversationId, message.messageId);
    if (view === undefined || !startsAtOnce(view.agent.interrupt, [], now)) return undefined;
    const reserved = deps.handoff.reserve();
    if (reserved === undefined) return undefined;
    const runId = randomUUID();
    const start = new EarlyStart(reserved);
    quiet.guessing(message.agentId, message.conversationId, runId);
    start.handOver(freshClaim({ ...view, now }, incomingOf(message), runId));
    return { start, runId, view };
  }

  /** A new request started for a reserved worker (already, when guessed), or queued when a ceiling says wait. */
  async function startNewRequest(room: Mailroom, incoming: IncomingMessage, why: string, start: EarlyStart, runId: string): Promise<Admission> {
    // The worker starts before the run is written: its first model call (replayable inference)
    // overlaps the insert and the commit. It goes first, as the call is what a reply waits on.
    // A guessed start was handed over before the read; an agent at its ceiling waits for the insert.
    if (!start.handedOver && !atCeiling.has(room.agent.id)) {
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
      if (!start.handedOver) start.handOver(freshClaim(room, incoming, runId));
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
    const incoming: IncomingMessage = { ...incomingOf(message), rowId: stored.messageRowId };
    // Only an agent whose new requests start at once is worth remembering: its next one may be guessed.
    const read: QuietView = { conversationId: stored.conversationId, agent: stored.agent, earlierProgress };
    const remembered = deps.quiet !== undefined && startsAtOnce(stored.agent.interrupt, [], now);
    holder.seen = remembered ? { view: read, live: runs.filter((run) => isLive(run.status)).map((run) => run.id) } : undefined;
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
    const startNow = plan.kind === "new_request" && deps.handoff !== undefined && startsAtOnce(room.agent.interrupt, runs, now);
    const guessed = holder.guess;
    const confirmed = guessed !== undefined && startNow && QuietConversations.holds(guessed.view, read);
    // A disproved guess's call is aborted before anything is written: its run never existed.
    if (guessed !== undefined && !confirmed) withdraw(holder);
    if (plan.kind === "needs_relation") {
      return { kind: "needs_relation", agent: room.agent, runId: plan.runId, request: target?.requestText ?? "" } as const;
    }
    if (plan.kind === "needs_consent") return { kind: "needs_consent", agent: room.agent, runId: plan.runId } as const;
    const note = answers.relation?.note ?? answers.consent?.note;
    // Only a fast model's triage comes after the admission; without one it is written with the run.
    if (plan.kind === "new_request" && hasFastModel(room.agent)) holder.triage = { agent: room.agent, text: message.text };
    if (confirmed) {
      holder.guess = undefined;
      holder.start = guessed.start;
      return done(await startNewRequest(room, incoming, withNote(plan.why, note), guessed.start, guessed.runId));
    }
    if (startNow) {
      const reserved = deps.handoff?.reserve();
      if (reserved !== undefined) {
        holder.start = new EarlyStart(reserved);
        return done(await startNewRequest(room, incoming, withNote(plan.why, note), holder.start, randomUUID()));
      }
    }
    if (plan.kind === "amend" && target?.id === plan.runId && target.graphRunning) holder.revised = plan.runId;
    return done(await applyPlan(room, plan, incoming, runs, note));
  }

  /** Withdraws the holder's guess, if the read has not confirmed it; once. */
  function withdraw(holder: Holder): void {
    if (holder.guess === undefined) return;
    holder.guess.start.withdraw();
    holder.guess = undefined;
    deps.quiet?.guessWithdrawn();
  }

  /** What the committed admission leaves of its conversation: quiet once the runs live after it end. */
  function remember(message: SubmittedMessage, holder: Holder, result: Admission): void {
    const quiet = deps.quiet;
    if (quiet === undefined) return;
    if (holder.seen === undefined) return quiet.forgetConversation(message.agentId, message.conversationId);
    const live = isLive(result.status) ? [...holder.seen.live, result.runId] : holder.seen.live;
    quiet.admitted(message.agentId, message.conversationId, holder.seen.view, live, message.messageId);
  }

  return {
    async admit(message, answers, now) {
      const holder: Holder = { guess: guessStart(message, answers, now) };
      // A guessed start's worker goes first, as in startNewRequest.
      if (holder.guess !== undefined) await new Promise<void>((resolve) => setImmediate(resolve));
      let attempt: AdmissionAttempt<Admission>;
      try {
        attempt = await deps.ledger.attempt((ledger) => attemptAdmit(ledger, message, answers, now, holder), isDone);
      } catch (error) {
        withdraw(holder);
        holder.start?.failed(error);
        deps.quiet?.forgetConversation(message.agentId, message.conversationId);
        throw error;
      }
      // A guess the read never confirmed (a duplicate, a question to ask): nothing was written for it.
      withdraw(holder);
      holder.start?.committed();
      if (attempt.kind === "done" && !attempt.result.duplicate) remember(message, holder, attempt.result);
      // Started only now: the early start and the commit never wait for it, and a rolled-back
      // admission never triages a run that does not exist.
      if (attempt.kind === "done" && !attempt.result.duplicate && holder.triage !== undefined) {
        deps.triage?.start(attempt.result.runId, holder.triage.agent, holder.triage.text);
      }
      if (attempt.kind === "done" && holder.revised !== undefined) deps.graphAmended?.(holder.revised);
      return attempt;
    },
    async edit(edit, now) {
      try {
        return await deps.ledger.attempt((ledger) => admitEdit(ledger, edit, now), () => true);
      } finally {
        // An edit may stop a run and start another: what this process knew of the conversation no longer holds.
        deps.quiet?.forgetConversation(edit.agentId, edit.conversationId);
      }
    },
    continueRun: (request, answers, now) => deps.ledger.attempt((ledger) => admitContinuation(ledger, request, answers, now), isDone),
  };
}
