// A run admission starts for an idle worker of this process. Its lifecycle:
//   reserved → handed over (the worker makes its first model call while the admission commits)
//            → confirmed (committed and started) | aborted (a ceiling queued it, or the commit failed)
//   reserved → released (never handed over: the worker goes back to claiming).
// A start made on a guess, before the admission read its conversation, is handed over at once and
// withdrawn when the read disproves the guess: its worker aborts the call, and nothing was written.
import type { ClaimedRun } from "../runner/run-store.js";
import { ClaimNotStarted } from "../domain/run-start.js";
import type { ReservedWorker } from "./worker-handoff.js";

export class EarlyStart {
  private state: "reserved" | "handed_over" | "done" = "reserved";
  private commit: { resolve: () => void; reject: (error: unknown) => void } | undefined;
  private handedRunId: string | undefined;

  constructor(private readonly worker: ReservedWorker) {}

  get workerId(): string {
    return this.worker.workerId;
  }

  get leaseMs(): number {
    return this.worker.leaseMs;
  }

  /** The worker starts on the run; every ledger call it makes waits for the admission's commit. */
  handOver(claimed: ClaimedRun): void {
    if (this.state !== "reserved") throw new Error(`a worker ${this.state} cannot be handed run ${claimed.runId}`);
    this.state = "handed_over";
    this.handedRunId = claimed.runId;
    const committed = new Promise<void>((resolve, reject) => (this.commit = { resolve, reject }));
    committed.catch(() => {}); // the worker sees a failure when it waits; here it is only reported
    this.worker.start(claimed, committed);
  }

  get handedOver(): boolean {
    return this.state === "handed_over";
  }

  /** A ceiling queued the run instead: a worker already on it aborts its call and lets it go. */
  notStarted(runId: string): void {
    this.finish(new ClaimNotStarted(runId));
  }

  /** The guess this start was made on did not hold; a no-op once the start is done. */
  withdraw(): void {
    this.finish(new ClaimNotStarted(this.handedRunId ?? "", "was not started: its conversation was not as this process last saw it"));
  }

  /** The admission committed: a handed-over worker goes on; one never handed over goes back to claiming. */
  committed(): void {
    this.finish(undefined);
  }

  /** The admission rolled back or failed: nothing it wrote exists. */
  failed(error: unknown): void {
    this.finish(error ?? new Error("admission failed"));
  }

  private finish(error: unknown): void {
    if (this.state === "reserved") this.worker.release();
    else if (this.state === "handed_over") {
      if (error === undefined) this.commit?.resolve();
      else this.commit?.reject(error);
    }
    this.state = "done";
  }
}
