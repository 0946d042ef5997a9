// The server's retention timer: every sweepMs, finished runs older than the ledger's retention_days
// are deleted (ledger/retention.repository.ts). The age is read at each sweep, so a change made on
// any replica applies on all. One sweep at a time; stop() waits for the one running.
import type { Logger } from "pino";
import type { Clock } from "./domain/clock.js";
import type { RetentionRepository } from "./ledger/retention.repository.js";

export interface RetentionSweeper {
  /** Runs one sweep now (or joins the one running); what the timer calls. */
  sweepNow(): Promise<void>;
  stop(): Promise<void>;
}

export function startRetentionSweeper(
  retention: RetentionRepository,
  settings: { readonly days: () => Promise<number>; readonly sweepMs: number },
  clock: Clock,
  log: Logger,
): RetentionSweeper {
  const stopping = new AbortController();
  let running: Promise<void> | undefined;
  const sweepNow = (): Promise<void> => {
    if (stopping.signal.aborted) return Promise.resolve();
    running ??= settings
      .days()
      // 0 days keeps every run: nothing to sweep.
      .then((days) => (days === 0 ? undefined : retention.sweep({ finishedBefore: new Date(clock.now().getTime() - days * 86_400_000), signal: stopping.signal })))
      .then(
        (counts) => {
          if (counts !== undefined && counts.runs > 0) log.info({ deleted: counts }, "retention deleted finished runs");
        },
        (error: unknown) => {
          if (!stopping.signal.aborted) log.warn({ err: error }, "retention sweep failed");
        },
      )
      .finally(() => (running = undefined));
    return running;
  };
  const timer = setInterval(() => void sweepNow(), settings.sweepMs);
  timer.unref();
  return {
    sweepNow,
    async stop() {
      clearInterval(timer);
      stopping.abort();
      await running;
    },
  };
}
