// The conversation as the planner (domain/interrupt.ts) sees it, from its runs read under lock.
import type { InterruptSettings } from "../domain/agent.js";
import { coalesceUntil, type ConversationState, type TargetRun } from "../domain/interrupt.js";
import { LIVE_STATUSES, type RunStatus } from "../domain/run.js";
import type { ConversationRun } from "./admission-ledger.js";

export const isLive = (status: RunStatus): boolean => (LIVE_STATUSES as readonly RunStatus[]).includes(status);

function toTarget(run: ConversationRun): TargetRun {
  return {
    runId: run.id,
    started: run.startedAt !== undefined,
    notBefore: run.notBefore,
    commitBoundary: run.commitBoundary,
    graphRunning: run.graphRunning,
    audience: { requesterId: run.requestedByActorId, addressedActorIds: run.actorIds },
    interruptions: run.interruptions,
    requestReceivedAt: run.requestReceivedAt,
  };
}

/**
 * The target is the request in progress, else the newest one waiting to start; a run already
 * told to stop is never a target. Continuation consent is only in question when nothing is live
 * and the newest run ended budget_exhausted without having been continued.
 */
export function conversationState(runs: readonly ConversationRun[], eligible: (run: ConversationRun) => boolean = () => true) {
  const live = runs.filter((run) => isLive(run.status) && !run.cancelRequested && eligible(run));
  const target = live.filter((run) => run.startedAt !== undefined).at(-1) ?? live.filter((run) => run.startedAt === undefined).at(-1);
  const newest = runs.at(-1);
  const exhausted = target === undefined && newest?.status === "budget_exhausted" && !newest.continued ? newest : undefined;
  const state: ConversationState = {
    target: target === undefined ? undefined : toTarget(target),
    exhausted: exhausted === undefined ? undefined : { runId: exhausted.id, requesterId: exhausted.requestedByActorId },
  };
  return { state, target, exhausted };
}

/**
 * Whether a new request may start the moment it commits: no coalesce window, and no root run of
 * the conversation live, so it heads the conversation's queue with nothing in flight. The
 * conversation's row lock keeps that true until the commit; the ceilings are checked where the
 * run is inserted.
 */
export function startsAtOnce(settings: InterruptSettings, runs: readonly ConversationRun[], now: Date): boolean {
  return runs.every((run) => !isLive(run.status)) && coalesceUntil(settings, now, now).getTime() <= now.getTime();
}
