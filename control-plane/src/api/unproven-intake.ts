// How much work connections without an authorized call may cost, for the whole process. Pacing
// answers (refusal-pacer.ts) slows a client that waits for them; a flood that does not wait (calls
// sent on a clock, a fresh connection every few dozen) still makes the server parse, screen and
// refuse every call it reads. So refusals also draw on a budget, and past it a connection that was
// just refused and never made an authorized call is not read again: its unread calls stay in the
// kernel's buffers and cost nothing. An answer already sent stands; refusals still waiting for
// their turn are dropped unanswered, since a write would make Node read the socket again. Such a
// connection is held until the oldest held connections are cut to make room, or for 30 s; a
// client that got Unauthenticated then should reconnect. Connections that made an
// authorized call are never held, and new connections are read as they come.
import { createTokenBucket } from "./token-bucket.js";

export interface IntakeOptions {
  /** Refusals a second (and `burst` at once) before refused unproven connections are held. */
  readonly perSecond: number;
  readonly burst: number;
  /** Connections held unread at most; past it the oldest is cut. */
  readonly maxHeld: number;
  /** How long a connection is held before it is cut (unread, it would never be seen to close). */
  readonly holdMs: number;
}

/** The budget of `perSecond` refusals a second: a second's worth at once, 256 connections held for 30 s at most. */
export function intakeBudget(perSecond: number): IntakeOptions {
  return { perSecond, burst: Math.max(1, Math.ceil(perSecond)), maxHeld: 256, holdMs: 30_000 };
}

export const DEFAULT_REFUSAL_BUDGET_PER_SECOND = 200;
export const DEFAULT_INTAKE = intakeBudget(DEFAULT_REFUSAL_BUDGET_PER_SECOND);

/** What the intake needs of a connection. */
export interface HeldSession {
  readonly closed: boolean;
  readonly destroyed: boolean;
  readonly socket: unknown;
  destroy(): void;
  settings(settings: { maxConcurrentStreams: number }): void;
  once(event: "close", listener: () => void): unknown;
}

export interface UnprovenIntake {
  /** `session` made an authorized call: it is never held. */
  proven(session: HeldSession): void;
  /** A call on `session` was refused; past the budget an unproven session stops being read. */
  refused(session: HeldSession): void;
  /**
   * Whether `session` is held. A call still read from it (the rest of the chunk that held it, or
   * after Node restarted reading once its last write finished) gets nothing: any write would let
   * Node read on. Reading is stopped again.
   */
  holds(session: HeldSession): boolean;
  /** Connections held unread now. */
  readonly held: number;
}

/**
 * Stops reading a connection's socket, or says it cannot. Node's HTTP/2 session reads its socket
 * itself and offers no pause; the socket's stream handle does (readStop). Without one the caller
 * cuts the connection instead, never leaving it read unbounded.
 */
function stopReading(session: HeldSession): boolean {
  const handle = (session.socket as { _handle?: { readStop?: () => number } } | null | undefined)?._handle;
  if (typeof handle?.readStop !== "function") return false;
  return handle.readStop() === 0;
}

/**
 * Holds a connection: no more of it is read, and the calls already read behind the one that held
 * it are refused by nghttp2 itself (a concurrency limit of 0 applies to them at once), before
 * Node builds a stream for any. A client honouring the setting sends no more calls on it.
 */
function holdOpen(session: HeldSession): boolean {
  if (!stopReading(session)) return false;
  try {
    session.settings({ maxConcurrentStreams: 0 });
  } catch {
    // Closing already (too many settings unacknowledged, or destroyed): not reading is enough.
  }
  return true;
}

/** `onHold` is told of each connection held, before it is (to drop what would write to it). */
export function createUnprovenIntake(options: IntakeOptions, onHold: (session: HeldSession) => void, clock: () => number = () => performance.now()): UnprovenIntake {
  const budget = createTokenBucket(options.perSecond, options.burst, clock);
  const proven = new WeakSet<HeldSession>();
  // When each was held; insertion order is age, so the first is the one cut to make room or for time.
  const held = new Map<HeldSession, number>();
  // Runs only while something is held, and never holds the process open.
  let sweeper: NodeJS.Timeout | undefined;

  const cut = (session: HeldSession) => {
    held.delete(session);
    session.destroy();
  };
  const sweep = () => {
    sweeper = undefined;
    const due = clock() - options.holdMs;
    for (const [session, heldAt] of held) {
      if (heldAt > due) break;
      cut(session);
    }
    if (held.size > 0) sweeper = setTimeout(sweep, Math.max(10, options.holdMs / 10)).unref();
  };

  const hold = (session: HeldSession) => {
    if (held.has(session) || proven.has(session) || session.closed || session.destroyed) return;
    if (!holdOpen(session)) {
      session.destroy();
      return;
    }
    onHold(session);
    held.set(session, clock());
    session.once("close", () => held.delete(session));
    if (held.size > options.maxHeld) cut(held.keys().next().value!);
    sweeper ??= setTimeout(sweep, Math.max(10, options.holdMs / 10)).unref();
  };

  return {
    proven(session) {
      proven.add(session);
    },
    refused(session) {
      if (!budget.take()) hold(session);
    },
    holds(session) {
      if (!held.has(session)) return false;
      stopReading(session);
      return true;
    },
    get held() {
      return held.size;
    },
  };
}
