// Moves admitted WorkGraphs on (issue #14 item 4). The state is the ledger's: a pass reads a
// graph's nodes under its row lock and writes what domain/work-graph-schedule.ts says, so any
// process may run a pass and a killed one loses nothing. Passes are asked for when a child run's
// claim ends (this process's workers say so at once) and by a slow sweep that finds what a
// crash between a child's settlement and its pass left behind.
import type { Logger } from "pino";
import type { JoinJob, JoinSettlement, PassResult, WorkGraphLedger } from "./work-graph-ledger.js";

export interface WorkGraphScheduler {
  /** Runs a pass over the root's graph soon; passes for one root never overlap in this process. */
  poke(rootRunId: string): void;
  /**
   * poke, resolving once a pass that began after this call has committed (or failed: it is logged
   * and swept); the joins it found due may still be reconciling. Never rejects.
   */
  passSoon(rootRunId: string): Promise<void>;
  /** Resolves when no pass is in flight (tests, shutdown). */
  idle(): Promise<void>;
  stop(): Promise<void>;
}

export interface WorkGraphSchedulerOptions {
  /** How often the sweep looks for graphs a missed pass left behind; 0 turns it off. */
  readonly sweepMs: number;
  /** Reconciles a join over inputs that ran in workspaces of their own (workspace-join.ts). */
  readonly reconcile: (job: JoinJob, signal: AbortSignal) => Promise<JoinSettlement>;
}

/** Rounds of reconcile-then-pass one poke may run: each settles a join, so a graph has at most its node count. */
const MAX_JOIN_ROUNDS = 100;

export function startWorkGraphScheduler(ledger: WorkGraphLedger, log: Logger, options: WorkGraphSchedulerOptions): WorkGraphScheduler {
  /** Per root: the pass in flight, whether another was asked for while it ran, and who waits for that one. */
  const passes = new Map<string, { running: Promise<void>; again: boolean; waiting: (() => void)[] }>();
  let stopped = false;
  const stopping = new AbortController();

  /** Joins due for reconciliation touch workspaces, so they run between passes; each settlement passes again. */
  const reconcileJoins = async (rootRunId: string, first: PassResult | undefined): Promise<PassResult | undefined> => {
    let result = first;
    for (let round = 0; result !== undefined && result.reconcile.length > 0 && round < MAX_JOIN_ROUNDS && !stopped; round++) {
      const settled = await Promise.all(result.reconcile.map((job) => options.reconcile(job, stopping.signal)));
      result = await ledger.settleJoins(rootRunId, settled);
    }
    return result;
  };

  /** One pass, then any joins it found due; `passed` is told once the pass itself has committed. */
  const run = (rootRunId: string, passed: () => void): Promise<void> =>
    ledger
      .advance(rootRunId)
      .finally(passed)
      .then((result) => reconcileJoins(rootRunId, result))
      .then(
        (result) => {
          if (result !== undefined && result.outcome !== "running") log.info({ rootRunId, outcome: result.outcome }, "work graph ended; root run queued");
        },
        (error: unknown) => log.warn({ err: error, rootRunId }, "work graph pass failed; the sweep retries it"),
      );

  const passSoon = (rootRunId: string): Promise<void> =>
    new Promise<void>((resolve) => {
      if (stopped) return resolve();
      const current = passes.get(rootRunId);
      if (current !== undefined) {
        // The pass in flight may have read the ledger before this change: the next one answers.
        current.again = true;
        current.waiting.push(resolve);
        return;
      }
      const entry = { running: Promise.resolve(), again: false, waiting: [resolve] };
      entry.running = (async () => {
        do {
          entry.again = false;
          const waiting = entry.waiting.splice(0);
          await run(rootRunId, () => waiting.forEach((done) => done()));
        } while (entry.again && !stopped);
        passes.delete(rootRunId);
        entry.waiting.splice(0).forEach((done) => done());
      })();
      passes.set(rootRunId, entry);
    });
  const poke = (rootRunId: string): void => void passSoon(rootRunId);

  let sweeping: Promise<void> | undefined;
  const timer =
    options.sweepMs > 0
      ? setInterval(() => {
          sweeping ??= ledger
            .stalledRoots()
            .then((roots) => roots.forEach(poke), (error: unknown) => log.warn({ err: error }, "work graph sweep failed"))
            .finally(() => (sweeping = undefined));
        }, options.sweepMs)
      : undefined;
  timer?.unref();

  const idle = async (): Promise<void> => {
    while (passes.size > 0) await Promise.all([...passes.values()].map((pass) => pass.running));
  };
  return {
    poke,
    passSoon,
    idle,
    async stop() {
      stopped = true;
      stopping.abort(new Error("the work graph scheduler stopped"));
      if (timer !== undefined) clearInterval(timer);
      await sweeping;
      await idle();
    },
  };
}
