import { randomUUID } from "node:crypto";
import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import { LeaseLostError } from "../domain/errors.js";
import type { WorkerHandoff } from "../conversation/worker-handoff.js";
import { ClaimNotStarted } from "../domain/run-start.js";
import type { ClaimedRun, Fence, ObservationLog } from "./run-store.js";
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

/** Where pools started later register: the ingress side is built before any worker runs. */
export interface WorkerHandoffHub extends WorkerHandoff {
  /** Adds a pool's idle workers; returns the function that removes them. */
  attach(source: WorkerHandoff): () => void;
}

export function createWorkerHandoff(): WorkerHandoffHub {
  const sources: WorkerHandoff[] = [];
  return {
    reserve() {
      for (const source of sources) {
        const reserved = source.reserve();
        if (reserved !== undefined) return reserved;
      }
      return undefined;
    },
    attach(source) {
      sources.push(source);
      return () => {
        const at = sources.indexOf(source);
        if (at >= 0) sources.splice(at, 1);
      };
    },
  };
}

/** A run admission claimed for a reserved worker, and the commit of that claim. */
interface Handover {
  readonly claimed: ClaimedRun;
  readonly committed: Promise<void>;
}

/** An idle worker's wait: woken to claim (undefined) or handed a run admission is claiming for it. */
interface IdleWorker {
  readonly workerId: string;
  wake(): void;
  hand(claim: Promise<Handover | undefined>): void;
}

/**
 * The runner's dependencies for a run whose claim is still committing: each ledger call waits
 * for the commit first (and fails with it), so nothing is read or written against a run that
 * may never exist. Only the model provider, which writes nothing, goes ahead.
 */
function afterCommit(deps: RunnerDeps, committed: Promise<void>): RunnerDeps {
  const store = new Proxy(deps.store, {
    get(target, key, receiver) {
      const value: unknown = Reflect.get(target, key, receiver);
      if (typeof value !== "function") return value;
      // The one synchronous method: the log is made at once, its appends wait.
      if (key === "observationLog") {
        return (fence: Fence, invocationId: string): ObservationLog => {
          const log = target.observationLog(fence, invocationId);
          return { append: (stream, text) => committed.then(() => log.append(stream, text)) };
        };
      }
      return async (...args: unknown[]) => {
        await committed;
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  // The lifecycle acks of a run not yet committed would find no run: they wait like the store.
  const lifecycle = deps.lifecycle;
  if (lifecycle === undefined) return { ...deps, store };
  return {
    ...deps,
    store,
    lifecycle: {
      reserveAcks: (runId, epoch, drafts) => committed.then(() => lifecycle.reserveAcks(runId, epoch, drafts)),
      sideUsage: (runId) => committed.then(() => lifecycle.sideUsage(runId)),
    },
  };
}

/**
 * Runs `workers` claim loops in this process. Each claims a run, advances it while
 * renewing its lease, and goes back for more. Several processes may run pools on one
 * database: SKIP LOCKED spreads the runs and the epoch fences the commits.
 *
 * A notification wakes one idle worker, not all of them: woken together, workers race
 * for the same row and all but one find nothing.
 */
export function startWorkerPool(
  deps: RunnerDeps,
  options: WorkerPoolOptions,
  runnable: RunnableFeed,
  log: Logger,
  handoff?: WorkerHandoffHub,
): WorkerPool {
  const stopping = new AbortController();
  // Every idle worker's wait and every in-flight model call listens on this one signal.
  setMaxListeners(0, stopping.signal);
  const processId = randomUUID().slice(0, 8);

  const idle: IdleWorker[] = [];
  // Wakes that found no idle worker: the next worker to go idle claims again at once.
  let missedWakes = 0;
  const unsubscribe = runnable((payload) => {
    if (payload === "") {
      for (const worker of idle.splice(0)) worker.wake();
      missedWakes = options.workers;
      return;
    }
    const worker = idle.shift();
    if (worker !== undefined) worker.wake();
    else missedWakes = Math.min(missedWakes + 1, options.workers);
  });
  const detach = handoff?.attach({
    reserve() {
      if (stopping.signal.aborted) return undefined;
      // The worker idle the shortest time: its connections and caches are the warmest.
      const worker = idle.pop();
      if (worker === undefined) return undefined;
      let settle!: (handover: Handover | undefined) => void;
      worker.hand(new Promise((resolve) => (settle = resolve)));
      return {
        workerId: worker.workerId,
        leaseMs: options.leaseMs,
        start: (claimed, committed) => settle({ claimed, committed }),
        release: () => settle(undefined),
      };
    },
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
      const worker = idle.shift();
      if (worker !== undefined) worker.wake();
      else missedWakes = Math.min(missedWakes + 1, options.workers);
    }, Math.max(0, Math.min(when - deps.now().getTime(), options.idlePollMs)) + 1);
    dueTimer.unref();
  };

  /**
   * Resolves to a handed-over claim (which may come to nothing) or, when woken or timed out, to
   * undefined. The claim comes wrapped: a promise resolved with a promise would wait for it.
   */
  const idleWait = (workerId: string): Promise<{ readonly claim: Promise<Handover | undefined> } | undefined> => {
    if (missedWakes > 0) {
      missedWakes -= 1;
      return Promise.resolve(undefined);
    }
    return new Promise((resolve) => {
      const leave = (): void => {
        clearTimeout(timer);
        stopping.signal.removeEventListener("abort", wake);
        const at = idle.indexOf(worker);
        if (at >= 0) idle.splice(at, 1);
      };
      const wake = (): void => {
        leave();
        resolve(undefined);
      };
      const worker: IdleWorker = {
        workerId,
        wake,
        hand(claim) {
          leave();
          resolve({ claim });
        },
      };
      const timer = setTimeout(wake, options.idlePollMs);
      stopping.signal.addEventListener("abort", wake, { once: true });
      idle.push(worker);
    });
  };

  const loop = async (workerId: string): Promise<void> => {
    // A run admission claimed for this worker. Taken even while stopping: the lease is already
    // this worker's, and advanceRun hands it back at its first checkpoint.
    let handed: { readonly claim: Promise<Handover | undefined> } | undefined;
    while (handed !== undefined || !stopping.signal.aborted) {
      let claimed: ClaimedRun | undefined;
      let committed: Promise<void> | undefined;
      if (handed !== undefined) {
        const handover = await handed.claim;
        handed = undefined;
        claimed = handover?.claimed;
        committed = handover?.committed;
        if (claimed === undefined) {
          // Released unclaimed: the run is queued and announced, or there was none. Back to
          // waiting; a wake that found no idle worker meanwhile is counted and not lost.
          if (!stopping.signal.aborted) handed = await idleWait(workerId);
          continue;
        }
      } else {
        try {
          claimed = await deps.store.claimNext(workerId, options.leaseMs);
        } catch (error) {
          log.error({ err: error, workerId }, "claim failed; retrying");
          handed = await idleWait(workerId);
          continue;
        }
        if (claimed === undefined) {
          wakeWhenDue(await deps.store.nextDueAt().catch(() => undefined));
          handed = await idleWait(workerId);
          continue;
        }
      }
      const run = claimed;
      const runLog = log.child({ runId: run.runId, workerId, epoch: run.epoch });
      const runDeps = committed === undefined ? deps : afterCommit(deps, committed);
      // This claim's work (its model call, its exec) stops at shutdown, when a handed run's
      // claim does not commit, and as soon as the lease is lost: another worker may hold the
      // run by then, so nothing more may reach a model or a sandbox host on this claim's behalf.
      const claim = new AbortController();
      const stop = (): void => claim.abort(stopping.signal.reason);
      if (stopping.signal.aborted) stop();
      else stopping.signal.addEventListener("abort", stop, { once: true });
      committed?.catch((error: unknown) => claim.abort(error));
      const unlink = (): void => stopping.signal.removeEventListener("abort", stop);
      const signal = claim.signal;
      // The lease is surely gone once renewals have failed for a whole lease period.
      let renewedAt = Date.now();
      const renew = setInterval(() => {
        runDeps.store.renewLease(run.runId, workerId, run.epoch, options.leaseMs).then(
          (held) => {
            if (held) renewedAt = Date.now();
            else if (!claim.signal.aborted) {
              runLog.warn("lease lost while working; this claim's work is stopped");
              claim.abort(new LeaseLostError(run.runId, run.epoch));
            }
          },
          (error: unknown) => {
            if (Date.now() - renewedAt < options.leaseMs) runLog.warn({ err: error }, "lease renewal failed; retrying");
            else if (!claim.signal.aborted) {
              runLog.warn({ err: error }, "lease renewals failed for a whole lease period; this claim's work is stopped");
              claim.abort(new LeaseLostError(run.runId, run.epoch));
            }
          },
        );
      }, Math.max(50, Math.floor(options.leaseMs / 3)));
      let failure: { readonly error: unknown } | undefined;
      try {
        await advanceRun(runDeps, run, { workerId, signal });
      } catch (error) {
        failure = { error };
      } finally {
        clearInterval(renew);
        unlink();
      }
      // A handed run whose claim never committed may end either way: with the error of a ledger
      // call that waited for the commit, or parked at a safe point the abort reached first.
      const refused = committed === undefined ? undefined : await committed.then(() => undefined, (reason: unknown) => reason ?? failure?.error);
      if (refused instanceof ClaimNotStarted) runLog.debug({ reason: refused.message }, "the run admission was starting for this worker did not start; its model call was aborted");
      else if (refused !== undefined) runLog.warn({ err: refused }, "the admission that claimed this run did not commit; nothing was written");
      else if (failure?.error instanceof LeaseLostError) runLog.warn(failure.error.message);
      else if (failure !== undefined && !stopping.signal.aborted) runLog.error({ err: failure.error }, "run step failed; the lease will expire and the run be retried");
      // A WorkGraph child's end was followed by its graph's pass, which started what it made ready
      // (on an idle worker, or announced): its worker goes back to waiting rather than to a claim
      // query that would find nothing, at the moment a graph's branches all end together. A run
      // admission handed over never stood in the queue, so its end says nothing of what waits
      // there: every queued run was announced, and a commit that frees a slot announces the runs
      // it lets start. Either worker waits; a wake that found no idle worker meanwhile is counted,
      // and the wait answers it at once. A run claimed from the queue may have more behind it:
      // its worker claims again straight away, so a backlog drains however long it is.
      if ((run.parentRunId !== undefined || committed !== undefined) && !stopping.signal.aborted) handed = await idleWait(workerId);
    }
  };

  const loops = Array.from({ length: options.workers }, (_, i) => loop(`worker-${processId}-${i}`));
  return {
    async stop() {
      stopping.abort(new Error("worker pool stopping"));
      clearTimeout(dueTimer);
      unsubscribe();
      detach?.();
      await Promise.allSettled(loops);
    },
  };
}
