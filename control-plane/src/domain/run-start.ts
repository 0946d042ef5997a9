// When a queued run may start: the one rule claimNext, admission and the waiting view share.
// The ledger renders it into SQL (ledger/run-start.sql.ts); a property test holds the two equal.
import { DEFAULT_MAX_CONCURRENT_ROOT_RUNS } from "./agent.js";
import { EXECUTING_STATUSES, LIVE_STATUSES, type RunStatus, type WaitReason } from "./run.js";

/** The install's ceiling on concurrent root runs across agents, when the operator sets none. */
export const DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS = 64;

/** An agent's own ceiling: a missing or zero setting means the default, never unbounded. */
export function agentCeiling(maxConcurrentRootRuns: number | undefined): number {
  return maxConcurrentRootRuns === undefined || maxConcurrentRootRuns <= 0 ? DEFAULT_MAX_CONCURRENT_ROOT_RUNS : maxConcurrentRootRuns;
}

/** A run as the start rule sees it. */
export interface StartFacts {
  readonly id: string;
  readonly agentId: string;
  readonly conversationId: string;
  readonly status: RunStatus;
  readonly paused: boolean;
  readonly isRoot: boolean;
  /** It has started before (it was running, then put back in the queue). */
  readonly started: boolean;
  readonly notBefore: Date;
  /** Its place in its conversation's queue: when its logical request arrived, then creation, then id. */
  readonly requestReceivedAt: Date;
  readonly createdAt: Date;
}

export interface StartWorld {
  /** Every run that could matter: the run's conversation and every root run executing. */
  readonly runs: readonly StartFacts[];
  readonly agentCeilingOf: (agentId: string) => number;
  readonly installCeiling: number;
  readonly now: Date;
}

const isLive = (status: RunStatus): boolean => (LIVE_STATUSES as readonly RunStatus[]).includes(status);
const isExecuting = (status: RunStatus): boolean => (EXECUTING_STATUSES as readonly RunStatus[]).includes(status);

/** Whether `a` is ahead of `b` in their conversation's queue (a successor keeps its request's place). */
export function aheadInQueue(a: StartFacts, b: StartFacts): boolean {
  const keys = (r: StartFacts) => [r.requestReceivedAt.getTime(), r.createdAt.getTime()] as const;
  const [a1, a2] = keys(a);
  const [b1, b2] = keys(b);
  if (a1 !== b1) return a1 < b1;
  if (a2 !== b2) return a2 < b2;
  return a.id < b.id;
}

/**
 * Why a queued run may not start now, or undefined when it may: paused; its coalesce window
 * still open; a fresh root run behind another of its conversation (one in flight, or one queued
 * ahead of it); a root run at its agent's or the install's ceiling of executing root runs.
 */
export function startBlocker(run: StartFacts, world: StartWorld): Exclude<WaitReason, "unknown_write_outcome" | "human_gate"> | undefined {
  if (run.paused) return "paused";
  if (run.notBefore.getTime() > world.now.getTime()) return "coalescing";
  if (!run.isRoot) return undefined;
  if (!run.started) {
    const busy = world.runs.some(
      (o) =>
        o.id !== run.id &&
        o.isRoot &&
        o.conversationId === run.conversationId &&
        ((o.started && isLive(o.status)) || (o.status === "queued" && !o.started && aheadInQueue(o, run))),
    );
    if (busy) return "conversation_busy";
  }
  const executing = world.runs.filter((o) => o.isRoot && isExecuting(o.status));
  const ofAgent = executing.filter((o) => o.agentId === run.agentId).length;
  if (ofAgent >= world.agentCeilingOf(run.agentId) || executing.length >= world.installCeiling) return "concurrency_ceiling";
  return undefined;
}

/** A queued run may start when nothing blocks it. */
export function mayStart(run: StartFacts, world: StartWorld): boolean {
  return run.status === "queued" && startBlocker(run, world) === undefined;
}

/**
 * Why a worker handed a run at admission lets it go when a ceiling queued the run instead of
 * starting it: nothing failed, the run waits for a worker like any other.
 */
export class ClaimNotStarted extends Error {
  constructor(
    readonly runId: string,
    why = "was queued behind a ceiling instead of started",
  ) {
    super(`run ${runId} ${why}`);
    this.name = "ClaimNotStarted";
  }
}
