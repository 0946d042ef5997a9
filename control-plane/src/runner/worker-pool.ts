import { randomUUID } from "node:crypto";
import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import { LeaseLostError } from "../domain/errors.js";
import { advanceRun, type RunnerDeps } from "./runner.js";

export interface WorkerPoolOptions {
  readonly workers: number;
  readonly leaseMs: number;
  /** Upper bound on an idle worker's sleep; LISTEN/NOTIFY usually wakes it sooner. Expired leases are found this way. */
  readonly idlePollMs: number;
}

/** Subscribes to "a run became runnable" notifications; an empty payload means "anything may have changed". */
export type RunnableFeed = (listener: (payload: string) => void) => () => void;

export interface WorkerPool {
  stop(): Promise<void>;
}

/**
 * Runs `workers` claim loops in this process. Each claims a run, advances it while
 * renewing its lease, and goes back for more. Several processes may run pools on one
 * database: SKIP LOCKED spreads the runs and the epoch fences the commits.
 *
 * A notification wakes one idle worker, not all of them: waking every worker for every
 * run made them race for the same row and halved throughput on a small machine.
 */
export function startWorkerPool(deps: RunnerDeps, options: WorkerPoolOptions, runnable: RunnableFeed, log: Logger): WorkerPool {
  const stopping = new AbortController();
  // Every idle worker's wait and every in-flight model call listens on this one signal.
  setMaxListeners(0, stopping.signal);
  const processId = randomUUID().slice(0, 8);

  const idle: (() => void)[] = [];
  // Wakes that found no idle worker: the next worker to go idle claims again at once.
  let missedWakes = 0;
  const unsubscribe = runnable((payload) => {
    if (payload === "") {
      for (const wake of idle.splice(0)) wake();
      missedWakes = options.workers;
      return;
    }
    const wake = idle.shift();
    if (wake !== undefined) wake();
    else missedWakes = Math.min(missedWakes + 1, options.workers);
  });

  // One timer for the pool: when the earliest coalescing run comes due, it wakes one idle
  // worker, as a notification would. Without it a run would start up to idlePollMs late.
  let dueTimer: NodeJS.Timeout | undefined;
  let dueAt = Number.POSITIVE_INFINITY;
  const wakeWhenDue = (at: Date | undefined): void => {
    if (at === undefined || stopping.signal.aborted) return;
    const when = at.getTime();
    if (when >= dueAt) return;
    clearTimeout(dueTimer);
    dueAt = when;
    dueTimer = setTimeout(() => {
      dueAt = Number.POSITIVE_INFINITY;
      const wake = idle.shift();
      if (wake !== undefined) wake();
      else missedWakes = Math.min(missedWakes + 1, options.workers);
    }, Math.max(0, Math.min(when - deps.now().getTime(), options.idlePollMs)) + 1);
    dueTimer.unref();
  };

  const idleWait = (): Promise<void> => {
    if (missedWakes > 0) {
      missedWakes -= 1;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        stopping.signal.removeEventListener("abort", done);
        const at = idle.indexOf(done);
        if (at >= 0) idle.splice(at, 1);
        resolve();
      };
      const timer = setTimeout(done, options.idlePollMs);
      stopping.signal.addEventListener("abort", done, { once: true });
      idle.push(done);
    });
  };

  const loop = async (workerId: string): Promise<void> => {
    while (!stopping.signal.aborted) {
      let claimed;
      try {
        claimed = await deps.store.claimNext(workerId, options.leaseMs);
      } catch (error) {
        log.error({ err: error, workerId }, "claim failed; retrying");
        await idleWait();
        continue;
      }
      if (claimed === undefined) {
        wakeWhenDue(await deps.store.nextDueAt().catch(() => undefined));
        await idleWait();
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
      clearTimeout(dueTimer);
      unsubscribe();
      await Promise.allSettled(loops);
    },
  };
}
