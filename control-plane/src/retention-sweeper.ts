// The server's retention timer: every sweepMs, finished runs older than the configured age are
// deleted (ledger/retention.repository.ts). One sweep at a time; stop() waits for the one running.
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
  settings: { readonly days: number; readonly sweepMs: number },
  clock: Clock,
  log: Logger,
): RetentionSweeper {
  const stopping = new AbortController();
  let running: Promise<void> | undefined;
  const sweepNow = (): Promise<void> => {
    if (settings.days === 0 || stopping.signal.aborted) return Promise.resolve();
    running ??= retention
      .sweep({ finishedBefore: new Date(clock.now().getTime() - settings.days * 86_400_000), signal: stopping.signal })
      .then(
        (counts) => {
          if (counts.runs > 0) log.info({ deleted: counts }, "retention deleted finished runs");
        },
        (error: unknown) => {
          if (!stopping.signal.aborted) log.warn({ err: error }, "retention sweep failed");
        },
      )
      .finally(() => (running = undefined));
    return running;
  };
  const timer = settings.days === 0 ? undefined : setInterval(() => void sweepNow(), settings.sweepMs);
  timer?.unref();
  return {
    sweepNow,
    async stop() {
      clearInterval(timer);
      stopping.abort();
      await running;
    },
  };
}
