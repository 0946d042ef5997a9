import { randomUUID } from "node:crypto";
import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import { LeaseLostError } from "../domain/errors.js";
import { advanceRun, type RunnerDeps } from "./runner.js";

export interface WorkerPoolOptions {
  readonly workers: number;
  readonly leaseMs: number;
  /** Upper bound on an idle worker's sleep; LISTEN/NOTIFY usually wakes it sooner. */
  readonly idlePollMs: number;
}

/** Wakes idle workers; the ledger's NOTIFY feeds it. Returns a wait that was armed before the claim. */
export type WakeSignal = () => { wait(timeoutMs: number, signal: AbortSignal): Promise<void> };

export interface WorkerPool {
  stop(): Promise<void>;
}

/**
 * Runs `workers` claim loops in this process. Each claims a run, advances it while
 * renewing its lease, and goes back for more. Several processes may run pools on one
 * database: SKIP LOCKED spreads the runs and the epoch fences the commits.
 */
export function startWorkerPool(deps: RunnerDeps, options: WorkerPoolOptions, armWake: WakeSignal, log: Logger): WorkerPool {
  const stopping = new AbortController();
  // Every idle worker's wait and every in-flight model call listens on this one signal.
  setMaxListeners(0, stopping.signal);
  const processId = randomUUID().slice(0, 8);

  const loop = async (workerId: string): Promise<void> => {
    while (!stopping.signal.aborted) {
      const wake = armWake();
      let claimed;
      try {
        claimed = await deps.store.claimNext(workerId, options.leaseMs);
      } catch (error) {
        log.error({ err: error, workerId }, "claim failed; retrying");
        await wake.wait(options.idlePollMs, stopping.signal);
        continue;
      }
      if (claimed === undefined) {
        await wake.wait(options.idlePollMs, stopping.signal);
        continue;
      }
      const runLog = log.child({ runId: claimed.runId, workerId, epoch: claimed.epoch });
      const renew = setInterval(() => {
        deps.store.renewLease(claimed.runId, workerId, claimed.epoch, options.leaseMs).then(
          (held) => {
            if (!held) runLog.warn("lease lost while working; this worker's commit will be refused");
          },
          (error: unknown) => runLog.warn({ err: error }, "lease renewal failed"),
        );
      }, Math.max(50, Math.floor(options.leaseMs / 3)));
      try {
        await advanceRun(deps, claimed, { workerId, signal: stopping.signal });
      } catch (error) {
        if (error instanceof LeaseLostError) runLog.warn(error.message);
        else if (!stopping.signal.aborted) runLog.error({ err: error }, "run step failed; the lease will expire and the run be retried");
      } finally {
        clearInterval(renew);
      }
    }
  };

  const loops = Array.from({ length: options.workers }, (_, i) => loop(`worker-${processId}-${i}`));
  return {
    async stop() {
      stopping.abort(new Error("worker pool stopping"));
      await Promise.allSettled(loops);
    },
  };
}
