// What a run that stops says, and the keys that make each notice idempotent. The runner (a run
// it holds settles) and the ledger (a parked run is stopped by an operator or a new message)
// both build their emissions here, so a stopped run says the same thing whoever stops it.
import { partialResultReply } from "./interrupt.js";
import type { EmissionDraft } from "./records.js";
import type { CommitBoundary, RunStatus } from "./run.js";

/** The ack a new request gets when it is admitted; it settles to one of the two below. */
export const WORKING_ACK = "⏳";
export const SUCCEEDED_ACK = "✅";
export const FAILED_ACK = "❌";

/**
 * Acks are keyed on the logical request (the first run of a supersession chain), so retries,
 * merged messages and supersessions never put a second hourglass or a second mark on it.
 */
export function ackKey(logicalRequestId: string, state: "working" | "started" | "thinking" | "settled"): string {
  return `ack:${logicalRequestId}:${state}`;
}

/** Shown between the hourglass and the mark: a worker took the request, then a model is thinking. */
export const STARTED_ACK = "👀";
export const THINKING_ACK = "🧠";

/**
 * The started and thinking acks of a request, as drafts. One of each per logical request, not per
 * run or model call: a retried or superseding run reuses the keys, and the reservation skips them.
 */
export function lifecycleAckDrafts(
  audience: Omit<SettlementAudience, "runId">,
  states: readonly ("started" | "thinking")[],
): EmissionDraft[] {
  const replyTo = audience.replyToMessageId === undefined ? {} : { replyToMessageId: audience.replyToMessageId };
  return states.map((state) => ({
    kind: "ack",
    idempotencyKey: ackKey(audience.logicalRequestId, state),
    text: state === "started" ? STARTED_ACK : THINKING_ACK,
    ackState: state,
    ...replyTo,
    addressedActorIds: audience.addressedActorIds,
  }));
}

/** A run has one reply at most, whoever settles it. */
export function replyKey(runId: string): string {
  return `reply:${runId}`;
}

/** One question per keel.ask_user call, however often its step is recovered. */
export function questionKey(invocationId: string): string {
  return `question:${invocationId}`;
}

/** Who a stopped run's notices go to and what they answer. */
export interface SettlementAudience {
  readonly runId: string;
  readonly logicalRequestId: string;
  readonly replyToMessageId: string | undefined;
  readonly addressedActorIds: readonly string[];
}

/**
 * A settled run's notices: its reply (when it has one) and the ack that replaces the
 * request's hourglass, succeeded only for a run that succeeded.
 */
export function settlementDrafts(audience: SettlementAudience, status: RunStatus, replyText: string | undefined): EmissionDraft[] {
  const replyTo = audience.replyToMessageId === undefined ? {} : { replyToMessageId: audience.replyToMessageId };
  const drafts: EmissionDraft[] = [];
  if (replyText !== undefined) {
    drafts.push({ kind: "reply", idempotencyKey: replyKey(audience.runId), text: replyText, ...replyTo, addressedActorIds: audience.addressedActorIds });
  }
  const succeeded = status === "succeeded";
  drafts.push({
    kind: "ack",
    idempotencyKey: ackKey(audience.logicalRequestId, "settled"),
    text: succeeded ? SUCCEEDED_ACK : FAILED_ACK,
    ackState: succeeded ? "succeeded" : "failed",
    ...replyTo,
    addressedActorIds: audience.addressedActorIds,
  });
  return drafts;
}

/** What a cancelled run had done: its steps and the writes that took effect. */
export interface WorkDone {
  readonly stepsDone: number;
  readonly effects: readonly string[];
}

/**
 * The reply of a cancelled run. Past the commit boundary it must say what was already done;
 * before it, there is none: the failed ack says enough.
 */
export function cancellationReply(commitBoundary: CommitBoundary, stoppedBy: string, done: () => WorkDone): string | undefined {
  if (commitBoundary !== "committed") return undefined;
  return partialResultReply({ stoppedBy, ...done() });
}

/** A question asked of the conversation (keel.ask_user), as an emission. */
export function questionDraft(audience: Omit<SettlementAudience, "runId" | "logicalRequestId">, invocationId: string, question: string): EmissionDraft {
  return {
    kind: "question",
    idempotencyKey: questionKey(invocationId),
    text: question,
    ...(audience.replyToMessageId === undefined ? {} : { replyToMessageId: audience.replyToMessageId }),
    addressedActorIds: audience.addressedActorIds,
  };
}

/** What a reply was decided on: the run's trigger count then, or undefined when more input may not change it. */
export interface ReplyGuard {
  readonly triggerCount: number | undefined;
}

/**
 * Whether a reply committed with this guard came back refused, with nothing written: a stop was
 * requested, or another trigger arrived, after the reply was decided.
 */
export function refusedReply(
  guard: ReplyGuard | undefined,
  control: { readonly cancelRequestedByActorId: string | undefined; readonly triggerCount: number },
): boolean {
  if (guard === undefined) return false;
  return control.cancelRequestedByActorId !== undefined || (guard.triggerCount !== undefined && control.triggerCount !== guard.triggerCount);
}
