// The port through which admission hands a run it starts to an idle worker of this process.
// The conversation layer owns it; the worker pool (runner/worker-pool.ts) implements it. A
// handed-over worker's `committed` rejects with ClaimNotStarted (domain/run-start.ts) when a
// ceiling queued the run instead.
import type { ClaimedRun } from "../runner/run-store.js";

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
