// The port through which admission hands a run it starts to an idle worker of this process.
// The conversation layer owns it; the worker pool (runner/worker-pool.ts) implements it.
import type { ClaimedRun } from "../runner/run-store.js";

/**
 * Why a handed-over worker's `committed` rejects when admission wrote the run after all but a
 * ceiling left it queued: nothing failed, the run waits for a worker like any other.
 */
export class ClaimNotStarted extends Error {
  constructor(readonly runId: string) {
    super(`run ${runId} was queued behind a ceiling instead of started`);
    this.name = "ClaimNotStarted";
  }
}

/** An idle worker taken aside for one run that admission is about to claim on its behalf. */
export interface ReservedWorker {
  /** The lease owner to claim the run for. */
  readonly workerId: string;
  readonly leaseMs: number;
  /**
   * The worker starts on the run at once, while `committed` is pending: the run may not exist
   * until it resolves, so the worker makes only its first model call (replayable inference) and
   * every ledger call waits. If it rejects, the call is aborted and the run dropped, nothing
   * written or sent.
   */
  start(claimed: ClaimedRun, committed: Promise<void>): void;
  /** No claim after all: the worker goes back to claiming. */
  release(): void;
}

/** Admission's way to an idle worker in this process; undefined when none is idle. */
export interface WorkerHandoff {
  reserve(): ReservedWorker | undefined;
}
