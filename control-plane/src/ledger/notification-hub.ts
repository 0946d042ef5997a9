import { EventEmitter } from "node:events";
import pg from "pg";

/**
 * keel_run_control carries a run id (or "" for every run) when what a working run must react to
 * changed; keel_tokens carries the id of a revoked token; keel_sandbox wakes the replica a sandbox
 * relay record is for (its replica id) or carries a direct command (sandbox/fleet-relay.ts).
 */
export type Channel = "keel_runs" | "keel_emissions" | "keel_run_events" | "keel_run_control" | "keel_tokens" | "keel_sandbox";

/**
 * How often at most one process notifies a channel, in ms (others: as soon as committed).
 * keel_run_events fires on every step commit and only moves watchers (WatchRun, the dashboard):
 * a hot loop pays one statement per spacing instead of one per commit, and a watcher hears of a
 * commit at most that much later, carrying every run committed meanwhile.
 */
export const NOTIFY_SPACING_MS: Readonly<Partial<Record<Channel, number>>> = { keel_run_events: 20 };

export interface NotificationHub {
  /** Calls `listener` with each payload on `channel` until the returned function is called. */
  subscribe(channel: Channel, listener: (payload: string) => void): () => void;
  close(): Promise<void>;
}

const CHANNELS: readonly Channel[] = ["keel_runs", "keel_emissions", "keel_run_events", "keel_run_control", "keel_tokens", "keel_sandbox"];

/**
 * One dedicated connection LISTENs for every channel and fans out in-process, so
 * idle workers and streaming RPCs wake on commits instead of polling the database.
 * Callers still poll slowly as a safety net: a notification may be lost while
 * this connection reconnects.
 */
export async function startNotificationHub(url: string, log: (message: string) => void): Promise<NotificationHub> {
  const emitter = new EventEmitter();
  emitter.setMaxListeners(0);
  let client: pg.Client | undefined;
  let closed = false;

  const connect = async (): Promise<void> => {
    const next = new pg.Client({ connectionString: url });
    next.on("notification", (message) => emitter.emit(message.channel, message.payload ?? ""));
    next.on("error", (error) => {
      log(`notification connection lost: ${error.message}`);
      void next.end().catch(() => {});
      if (!closed) setTimeout(() => void reconnect(), 500);
    });
    await next.connect();
    for (const channel of CHANNELS) await next.query(`LISTEN ${channel}`);
    client = next;
    // Anything committed while we were away: wake everyone once.
    for (const channel of CHANNELS) emitter.emit(channel, "");
  };
  const reconnect = async (): Promise<void> => {
    try {
      await connect();
    } catch (error) {
      log(`notification reconnect failed: ${(error as Error).message}`);
      if (!closed) setTimeout(() => void reconnect(), 1000);
    }
  };
  await connect();

  return {
    subscribe(channel, listener) {
      emitter.on(channel, listener);
      return () => emitter.off(channel, listener);
    },
    async close() {
      closed = true;
      emitter.removeAllListeners();
      await client?.end().catch(() => {});
    },
  };
}

export interface ArmedNotification {
  /** Resolves on the notification (at once if it already came), after timeoutMs, or on abort. */
  wait(timeoutMs: number, signal: AbortSignal): Promise<void>;
  /** Disarms without waiting. */
  cancel(): void;
}

/**
 * Arms a one-shot wake-up on `channel` before the caller reads the database, so a
 * notification that lands between the read and the wait is not lost.
 */
export function armNotification(
  hub: NotificationHub,
  channel: Channel,
  accept: (payload: string) => boolean,
): ArmedNotification {
  let fired = false;
  let wake: (() => void) | undefined;
  const unsubscribe = hub.subscribe(channel, (payload) => {
    if (payload !== "" && !accept(payload)) return;
    fired = true;
    wake?.();
  });
  return {
    wait(timeoutMs, signal) {
      return new Promise((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          unsubscribe();
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, fired || signal.aborted ? 0 : timeoutMs);
        wake = done;
        signal.addEventListener("abort", done, { once: true });
      });
    },
    cancel: unsubscribe,
  };
}
