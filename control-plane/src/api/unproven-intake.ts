// How much work connections without an authorized call may cost, for the whole process. Pacing
// answers (refusal-pacer.ts) slows a client that waits for them; a flood that does not wait (calls
// sent on a clock, a fresh connection every few dozen) still makes the server parse, screen and
// refuse every call it reads. So refusals also draw on a budget, and past it a connection that was
// just refused and never made an authorized call is not read again: its unread calls stay in the
// kernel's buffers and cost nothing. An answer already sent stands; refusals still waiting for
// their turn are dropped unanswered, since a write would make Node read the socket again. Such a
// connection is held until the oldest held connections are cut to make room, or for 30 s; a
// client that got Unauthenticated then should reconnect. Connections that made an
// authorized call are never held.
// A flood that opens a fresh connection every few dozen calls would still cost an HTTP/2 session
// and its first refusals per connection, so once an address has `parkAfterHeld` connections held,
// its new connections are parked: accepted and never read (no HTTP/2 session is made for them),
// then cut after the same 30 s or when the oldest parked must make room. Other addresses, and
// connections already open, are read as before.
import { createTokenBucket } from "./token-bucket.js";

export interface IntakeOptions {
  /** Refusals a second (and `burst` at once) before refused unproven connections are held. */
  readonly perSecond: number;
  readonly burst: number;
  /** Connections held unread at most; past it the oldest is cut. */
  readonly maxHeld: number;
  /** How long a connection is held (or parked) before it is cut (unread, it would never be seen to close). */
  readonly holdMs: number;
  /** Connections held from one address past which its new connections are parked. */
  readonly parkAfterHeld: number;
  /** Connections parked at most; past it the oldest is cut. */
  readonly maxParked: number;
}

/**
 * The budget of `perSecond` refusals a second: a second's worth at once, 256 connections held
 * and 1,024 parked, each for 30 s at most; an address's new connections are parked once 8 of its
 * connections are held.
 */
export function intakeBudget(perSecond: number): IntakeOptions {
  return { perSecond, burst: Math.max(1, Math.ceil(perSecond)), maxHeld: 256, holdMs: 30_000, parkAfterHeld: 8, maxParked: 1_024 };
}

export const DEFAULT_REFUSAL_BUDGET_PER_SECOND = 200;
export const DEFAULT_INTAKE = intakeBudget(DEFAULT_REFUSAL_BUDGET_PER_SECOND);

/** What a pen needs of a connection: a way to cut it, and word when it closes. */
interface Cuttable {
  destroy(): void;
  once(event: "close", listener: () => void): unknown;
}

/** What the intake needs of an HTTP/2 session. */
export interface HeldSession extends Cuttable {
  readonly closed: boolean;
  readonly destroyed: boolean;
  readonly socket: unknown;
  settings(settings: { maxConcurrentStreams: number }): void;
}

/** What the intake needs of a new connection's socket. */
export interface NewConnection extends Cuttable {
  readonly remoteAddress?: string | undefined;
  on(event: "error", listener: (error: Error) => void): unknown;
}

export interface UnprovenIntake {
  /**
   * Whether a new connection may be read. One from an address with `parkAfterHeld` connections
   * held is parked instead: never read, cut after `holdMs` or to make room for a newer one.
   */
  admit(connection: NewConnection): boolean;
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
  /** New connections parked unread now. */
  readonly parked: number;
}

/**
 * Stops reading a connection's socket, or says it cannot. Node's HTTP/2 session reads its socket
 * itself and offers no pause; the socket's stream handle does (readStop). Without one the caller
 * cuts the connection instead, never leaving it read unbounded.
 */
function stopReading(session: HeldSession): boolean {
  return stopReadingSocket(session.socket);
}

function stopReadingSocket(socket: unknown): boolean {
  const handle = (socket as { _handle?: { readStop?: () => number } } | null | undefined)?._handle;
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

/** The remote address a session's connection came from ("unknown" when the socket does not say). */
function addressOf(socket: unknown): string {
  return (socket as { remoteAddress?: string } | null | undefined)?.remoteAddress ?? "unknown";
}

/**
 * Connections kept unread, oldest first (a Map keeps insertion order): past `max` the oldest is
 * cut, and `cutKeptSince` cuts those kept since before a time. A connection's `left` runs once when
 * it leaves, cut or closed.
 */
function createPen<T extends Cuttable>(max: number) {
  const kept = new Map<T, { readonly at: number; readonly left: () => void }>();
  const forget = (connection: T) => {
    const entry = kept.get(connection);
    if (entry === undefined) return;
    kept.delete(connection);
    entry.left();
  };
  const cut = (connection: T) => {
    forget(connection);
    connection.destroy();
  };
  return {
    has: (connection: T) => kept.has(connection),
    get size() {
      return kept.size;
    },
    keep(connection: T, at: number, left: () => void = () => {}) {
      kept.set(connection, { at, left });
      connection.once("close", () => forget(connection));
      if (kept.size > max) cut(kept.keys().next().value!);
    },
    cutKeptSince(due: number) {
      for (const [connection, { at }] of kept) {
        if (at > due) break;
        cut(connection);
      }
    },
  };
}

/** `onHold` is told of each connection held, before it is (to drop what would write to it). */
export function createUnprovenIntake(options: IntakeOptions, onHold: (session: HeldSession) => void, clock: () => number = () => performance.now()): UnprovenIntake {
  const budget = createTokenBucket(options.perSecond, options.burst, clock);
  const proven = new WeakSet<HeldSession>();
  const heldPerAddress = new Map<string, number>();
  const count = (address: string, by: number) => {
    const n = (heldPerAddress.get(address) ?? 0) + by;
    if (n <= 0) heldPerAddress.delete(address);
    else heldPerAddress.set(address, n);
  };
  const held = createPen<HeldSession>(options.maxHeld);
  const parked = createPen<NewConnection>(options.maxParked);
  // Runs only while something is held or parked, and never holds the process open.
  let sweeper: NodeJS.Timeout | undefined;
  const sweep = () => {
    sweeper = undefined;
    const due = clock() - options.holdMs;
    held.cutKeptSince(due);
    parked.cutKeptSince(due);
    if (held.size + parked.size > 0) startSweeper();
  };
  const startSweeper = () => {
    sweeper ??= setTimeout(sweep, Math.max(10, options.holdMs / 10)).unref();
  };

  const hold = (session: HeldSession) => {
    if (held.has(session) || proven.has(session) || session.closed || session.destroyed) return;
    if (!holdOpen(session)) {
      session.destroy();
      return;
    }
    onHold(session);
    // Read now: a destroyed session no longer says where it came from.
    const address = addressOf(session.socket);
    count(address, 1);
    held.keep(session, clock(), () => count(address, -1));
    startSweeper();
  };

  const park = (connection: NewConnection) => {
    // A reset from the far end must not go unheard (an unheard 'error' would end the process).
    connection.on("error", () => {});
    if (!stopReadingSocket(connection)) {
      connection.destroy();
      return;
    }
    parked.keep(connection, clock());
    startSweeper();
  };

  return {
    admit(connection) {
      if ((heldPerAddress.get(addressOf(connection)) ?? 0) < options.parkAfterHeld) return true;
      park(connection);
      return false;
    },
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
    get parked() {
      return parked.size;
    },
  };
}
