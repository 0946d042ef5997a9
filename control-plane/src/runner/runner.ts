import { budgetBeforeModelCall } from "../domain/budget.js";
import { batchReadOutcomes, DEFAULT_READ_FLUSH_MS } from "./read-outcome-batching.js";
import { recover } from "./recovery.js";
import type { ClaimedRun } from "./run-store.js";
import { finish } from "./run-settlement.js";
import { CONTINUE, PARK, RunSession, type Next, type RunnerDeps as SessionDeps, type StepContext } from "./run-session.js";
import { takeTurn } from "./turn.js";
import type { ProgressSupervisors } from "../progress/progress-supervisor.js";
import { holdingNotices, supervisedRun } from "../progress/run-progress.js";

export type { StepContext } from "./run-session.js";

export interface RunnerDeps extends SessionDeps {
  /** Progress supervisors (progress/): one per claim, stopped and joined before the run's end is committed. */
  readonly progress?: ProgressSupervisors;
}

/**
 * Drives one claimed run until it settles or parks, in the order the harness contract
 * gives: load the durable state; prepare the profile's turn and the policy-filtered
 * catalog; make and validate one model turn; commit the step with every call's intent;
 * then, per call, authorize again, dispatch and commit its result. Every write is
 * fenced by the lease epoch, so a worker that lost its lease changes nothing.
 */
export async function advanceRun(deps: RunnerDeps, claimed: ClaimedRun, context: StepContext): Promise<void> {
  const tracing = deps.tracing;
  if (tracing === undefined) return advanceClaim(deps, claimed, context);
  return tracing.claim(claimed, context.workerId, () => advanceClaim(deps, claimed, context));
}

async function advanceClaim(deps: RunnerDeps, claimed: ClaimedRun, context: StepContext): Promise<void> {
  const flushAfterMs = deps.readFlushMs ?? DEFAULT_READ_FLUSH_MS;
  const controlChanges = deps.controlChanges;
  const store =
    flushAfterMs <= 0
      ? undefined
      : batchReadOutcomes(deps.store, {
          flushAfterMs,
          ...(controlChanges === undefined
            ? {}
            : { watchControl: (changed: () => void) => controlChanges((runId) => (runId === "" || runId === claimed.runId) && changed()) }),
          onFlushError: (error) => deps.log.warn({ err: error, runId: claimed.runId }, "committing held read results failed; the next commit reports it"),
        });
  // A WorkGraph child says nothing in the conversation, progress included.
  const progress = claimed.parentRunId === undefined ? deps.progress?.supervise(supervisedRun(claimed, context)) : undefined;
  const held = progress === undefined ? store : holdingNotices(store ?? deps.store, progress);
  const session = new RunSession(held === undefined ? deps : { ...deps, store: held }, claimed, context);
  session.log.debug({ stepCount: claimed.stepCount }, "driving the run");
  try {
    const next = await drive(session);
    // The supervisor is joined before a failure, cancellation or exhaustion reply is committed.
    await progress?.stop();
    await finish(session, next);
  } finally {
    await progress?.stop();
    store?.close();
    if (claimed.parentRunId !== undefined) await deps.childClaimEnded?.(claimed.parentRunId);
  }
}

/** Phases in order, each saying what happens next, until one ends this claim. */
async function drive(session: RunSession): Promise<Next> {
  const claimed = session.claimed;
  // A fresh run with nothing to inherit has no history to read: its first model call waits on nothing.
  if (claimed.stepCount > 0 || claimed.inheritsFromRunId !== undefined) {
    const recovered = await recover(session);
    if (recovered.kind !== "continue") return recovered;
  } else if (claimed.earlierProgress !== undefined) {
    session.history = { ...session.history, progress: claimed.earlierProgress };
  } else if (session.deps.conversationHistory !== undefined && claimed.parentRunId === undefined) {
    // A follow-up sees the conversation's latest progress records: one indexed read.
    session.history = { ...session.history, progress: await session.deps.conversationHistory.recentProgress(claimed.conversationId, claimed.runId) };
  }
  for (;;) {
    const safe = await checkpoint(session);
    if (safe.kind !== "continue") return safe;
    const check = budgetBeforeModelCall(claimed.agent.budget, session.usage, session.elapsed());
    if (check !== undefined) return { kind: "exhaust", check };
    const began = performance.now();
    const tracing = session.deps.tracing;
    const next = tracing === undefined ? await takeTurn(session) : await tracing.step(claimed.runId, session.stepIndex, () => takeTurn(session));
    session.deps.latencies?.record("step", performance.now() - began);
    if (next.kind !== "continue") return next;
  }
}

/** Safe point: stop for shutdown, cancellation or pause before doing anything new. */
async function checkpoint(session: RunSession): Promise<Next> {
  if (session.context.signal.aborted) {
    await session.store.release(session.fence, "worker shutting down; handed back").catch(() => {});
    return PARK;
  }
  const control = session.control;
  if (control.supersededByRunId !== undefined) return { kind: "supersede", successorId: control.supersededByRunId };
  if (control.cancelRequestedByActorId !== undefined) return { kind: "cancel", actorId: control.cancelRequestedByActorId };
  if (control.paused) {
    await session.store.release(session.fence, "paused by an operator");
    return PARK;
  }
  // An amendment arrived since the run last read its input: the next model call sees it.
  if (control.triggerCount !== session.triggerCount) await session.reloadTriggers();
  return CONTINUE;
}
