// Group commit for read results. A read is replayable: if its result is lost, recovery marks
// the call interrupted and the model may ask again. So a worker need not spend a commit on
// each read's result: the result rides with the run's next commit (the next step, usually a
// few milliseconds later when the model is fast), atomically with it and ordered before it.
// When the next commit does not come soon (a slow model call), the held results are
// committed on their own after `flushAfterMs`, so the ledger never lags a read by more than
// that. Writes, refusals, interruptions and anything that parks or settles the run are
// committed at once, carrying whatever reads are held.
import { refusedReply } from "../domain/settlement.js";
import type { RunControlState, RunStore, StepCommit, ToolOutcomeCommit } from "./run-store.js";

/** How long a finished read's result may wait for the run's next commit. */
export const DEFAULT_READ_FLUSH_MS = 100;

export interface BatchingRunStore extends RunStore {
  /** Stops the flush timer; held results are dropped (recovery treats them as interrupted reads). */
  close(): void;
}

export interface ReadBatchingOptions {
  readonly flushAfterMs: number;
  /**
   * Subscribes to changes of this run's control state; returns the unsubscribe. With it, a held
   * read returns the control state of the last commit unless a change was signalled since.
   */
  readonly watchControl?: (changed: () => void) => () => void;
  /** A timed flush that fails (lease lost, database down) is reported here and again by the next commit. */
  readonly onFlushError?: (error: unknown) => void;
}

/** Per run and worker: wraps the store the driver commits through. */
export function batchReadOutcomes(store: RunStore, options: ReadBatchingOptions): BatchingRunStore {
  let held: ToolOutcomeCommit[] = [];
  let timer: NodeJS.Timeout | undefined;
  let failure: Error | undefined;
  let closed = false;
  /** The control state as of the last commit, and whether a change was signalled since it began. */
  let lastControl: RunControlState | undefined;
  let changed = true;
  const unwatch = options.watchControl?.(() => {
    changed = true;
  });
  const committing = async (commit: () => Promise<RunControlState>): Promise<RunControlState> => {
    // A change signalled from here on may have missed this commit's snapshot: it stays flagged.
    changed = options.watchControl === undefined;
    try {
      lastControl = await commit();
    } catch (error) {
      changed = true;
      throw error;
    }
    return lastControl;
  };
  /** Commits are made one at a time, in order: a timed flush and the driver's next commit never race. */
  let queue: Promise<unknown> = Promise.resolve();

  const serial = <T>(work: () => Promise<T>): Promise<T> => {
    const next = queue.then(work, work);
    queue = next.catch(() => {});
    return next;
  };

  const take = (): ToolOutcomeCommit[] => {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    const taken = held;
    held = [];
    return taken;
  };

  const throwIfFlushFailed = (): void => {
    if (failure === undefined) return;
    const error = failure;
    failure = undefined;
    throw error;
  };

  /** A commit of nothing but held results, leaving the run as the last of them left it. */
  const resultsOnly = (prior: readonly ToolOutcomeCommit[]): StepCommit => {
    const last = prior[prior.length - 1]!;
    return { runId: last.runId, workerId: last.workerId, epoch: last.epoch, step: undefined, priorOutcomes: prior, status: last.status, usage: last.usage, emissions: [], summary: last.summary };
  };
  /** The commit with the held results in front of its own. */
  const withPrior = <C extends StepCommit | ToolOutcomeCommit>(commit: C, prior: readonly ToolOutcomeCommit[]): C =>
    prior.length === 0 ? commit : { ...commit, priorOutcomes: [...prior, ...(commit.priorOutcomes ?? [])] };

  const flush = (): Promise<void> =>
    serial(async () => {
      if (held.length === 0 || closed) return;
      const commit = resultsOnly(take());
      try {
        await committing(() => store.commitStep(commit));
      } catch (error) {
        failure = error instanceof Error ? error : new Error("committing held read results failed", { cause: error });
        options.onFlushError?.(error);
      }
    });

  return {
    ...store,
    commitStep: (commit: StepCommit) =>
      serial(async () => {
        throwIfFlushFailed();
        const prior = take();
        const control = await committing(() => store.commitStep(withPrior(commit, prior)));
        // Refused, nothing written: what it carried is held again, for the commit that stops the run.
        if (refusedReply(commit.unlessChangedSince, control)) held = [...prior, ...held];
        return control;
      }),
    commitToolOutcome: (commit: ToolOutcomeCommit) =>
      serial(async () => {
        throwIfFlushFailed();
        if (holdable(commit)) {
          held.push(commit);
          if (timer === undefined) timer = setTimeout(() => void flush(), options.flushAfterMs);
          // No commit to read it back from: cancellation, supersession, pauses and amendments
          // must stay as prompt as a commit would have made them. Known unchanged since the
          // last commit, its state stands; otherwise a cheap read.
          if (!changed && lastControl !== undefined) return lastControl;
          changed = options.watchControl === undefined;
          lastControl = await store.readControl(commit.runId);
          return lastControl;
        }
        const carried = withPrior(commit, take());
        return committing(() => store.commitToolOutcome(carried));
      }),
    release: (fence, summary) =>
      serial(async () => {
        // Handing the run back: what is held is committed first, so the next worker sees it.
        const prior = take();
        if (prior.length > 0 && failure === undefined) await store.commitStep(resultsOnly(prior));
        await store.release(fence, summary);
      }),
    close() {
      closed = true;
      unwatch?.();
      take();
    },
  };
}

/** A read that finished (either way) while the run goes on: nothing about it must be durable at once. */
function holdable(commit: ToolOutcomeCommit): boolean {
  return (
    commit.effect === "read" &&
    (commit.outcome === "succeeded" || commit.outcome === "failed") &&
    (commit.status === "running" || commit.status === "awaiting_tool") &&
    commit.emissions.length === 0 &&
    commit.waitReason === undefined &&
    commit.answeredByActorId === undefined &&
    commit.resolvedOutcome === undefined &&
    (commit.priorOutcomes ?? []).length === 0
  );
}
