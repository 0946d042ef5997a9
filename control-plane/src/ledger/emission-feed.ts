// One emission reader per process, fanning out to every Subscribe stream. Before it, each
// stream took the emission-order lock exclusively on every wake and re-read its connector's
// rows: a commit that wrote an emission queued behind hundreds of such instants. Now the
// settled horizon is read once per wake for the whole process (one exclusive instant), a
// connector's new rows once for all its streams at the tail and handed to each stream's sink
// there and then, and a stream that is behind catches up on its own with reads bounded by that
// horizon, which need no lock at all.
import type { EmissionRecord } from "../domain/records.js";
import { createDeliveryPacer } from "./delivery-pacer.js";
import type { NotificationHub } from "./notification-hub.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_SEQUENCE_LOCK } from "./ledger-writes.js";
import { EMISSION_COLUMNS, type EmissionRow } from "./rows/ledger-rows.js";
import { raw, statement, type Sql } from "./sql.js";

/**
 * The settled horizon: with the emission-order lock held exclusively (for this statement only),
 * no writer is between drawing a seq and finishing its commit, so every seq up to the sequence's
 * last value is committed or gone for good (see EMISSION_SEQUENCE_LOCK). New writers wait only
 * while this read waits for the writers in flight to commit; they never wait for each other.
 * A CTE calling a volatile function is evaluated, once, before the row that reads from it.
 */
const settledHorizon = statement<Record<string, never>, { horizon: string }>("emission_settled_horizon")`
  WITH barrier AS (SELECT pg_advisory_xact_lock(${raw(String(EMISSION_SEQUENCE_LOCK))}) AS held)
  SELECT coalesce(pg_sequence_last_value('emissions_seq_seq'::regclass), 0) AS horizon FROM barrier`;

/** A connector's rows in (afterSeq, horizon]: below a settled horizon a snapshot is final. */
const emissionsUpTo = statement<{ connector: string; afterSeq: number; horizon: number; limit: number }, EmissionRow>("emission_list_after")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e
  WHERE e.connector = ${(p) => p.connector} AND e.seq > ${(p) => p.afterSeq} AND e.seq <= ${(p) => p.horizon}::bigint
  ORDER BY e.seq LIMIT ${(p) => p.limit}`;

/** Takes one row; a promise when it can take no more until that settles. */
export type EmissionSink = (row: EmissionRecord) => Promise<void> | undefined;

export interface EmissionFeed {
  /**
   * Hands a connector's emissions after `afterSeq` to `sink`, oldest first, each once, until
   * `signal` aborts. At the tail a commit's rows are handed to every stream's sink at once, in the
   * reader's turn: no wake-up, promise or generator step per stream.
   */
  pipe(connector: string, afterSeq: number, signal: AbortSignal, sink: EmissionSink): Promise<void>;
  /** The same as an iterator, with deliveries paced across event-loop turns (see delivery-pacer.ts). */
  follow(connector: string, afterSeq: number, signal: AbortSignal): AsyncGenerator<EmissionRecord>;
  close(): void;
}

export interface EmissionFeedOptions {
  /** Safety net for a lost notification: every tail is re-read this often. */
  readonly pollMs: number;
  /** Rows one query reads at most. */
  readonly batch?: number;
  /** Rows a follow() holds for its reader before the feed waits for it (it then reads for itself). */
  readonly maxQueued?: number;
  /** Deliveries (rows handed to follow()'s readers) per event-loop turn, for the whole process; see delivery-pacer.ts. */
  readonly deliveriesPerTurn?: number;
}

/** A stream at its connector's tail: rows are handed to its sink as the horizon moves. */
interface TailMember {
  readonly sink: EmissionSink;
  /** The last seq handed to the sink. */
  cursor: number;
  /** Set when the sink asked to wait: the member has left the tail, and reads for itself once it settles. */
  behind: Promise<void> | undefined;
  failure: Error | undefined;
  left: boolean;
  wake: (() => void) | undefined;
}

/** The streams of one connector at the tail, and how far that connector has been read for them. */
interface Tail {
  horizon: number;
  dirty: boolean;
  readonly members: Set<TailMember>;
}

const asError = (error: unknown): Error => (error instanceof Error ? error : new Error(String(error)));

/** Resolves when `promise` settles or `signal` aborts, whichever is first. */
function untilSettledOrAborted(promise: Promise<void>, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      signal.removeEventListener("abort", done);
      resolve();
    };
    signal.addEventListener("abort", done, { once: true });
    promise.then(done, done);
  });
}

export function createEmissionFeed(sql: Sql, hub: NotificationHub, options: EmissionFeedOptions): EmissionFeed {
  const batch = options.batch ?? 200;
  const maxQueued = options.maxQueued ?? 2_000;
  const pacer = createDeliveryPacer(options.deliveriesPerTurn ?? 8);
  const tails = new Map<string, Tail>();
  let horizon = 0;
  let reading: Promise<number> | undefined;
  let pumping = false;

  /** One horizon read at a time for the whole process; callers arriving meanwhile share it. */
  const readHorizon = (): Promise<number> =>
    (reading ??= sql
      .run(settledHorizon, {})
      .then(([row]) => (horizon = Math.max(horizon, Number(row?.horizon ?? 0))))
      .finally(() => (reading = undefined)));

  const rowsUpTo = async (connector: string, afterSeq: number, upTo: number): Promise<EmissionRecord[]> =>
    (await sql.run(emissionsUpTo, { connector, afterSeq, horizon: upTo, limit: batch })).map(toEmissionRecord);

  const leave = (tail: Tail, member: TailMember): void => {
    member.left = true;
    tail.members.delete(member);
    member.wake?.();
  };

  const deliver = (tail: Tail, rows: readonly EmissionRecord[]): void => {
    for (const member of tail.members) {
      for (const row of rows) {
        if (row.seq <= member.cursor) continue;
        let wait: Promise<void> | undefined;
        try {
          wait = member.sink(row);
        } catch (error) {
          member.failure = asError(error);
          leave(tail, member);
          break;
        }
        member.cursor = row.seq;
        if (wait !== undefined) {
          // Too far behind to take more now: it leaves the tail and reads for itself once it can.
          member.behind = wait;
          leave(tail, member);
          break;
        }
      }
    }
  };

  /** Reads the horizon, then each dirty connector's new rows once, until nothing is dirty. */
  const pump = async (): Promise<void> => {
    if (pumping) return;
    pumping = true;
    try {
      while ([...tails.values()].some((tail) => tail.dirty && tail.members.size > 0)) {
        const upTo = await readHorizon();
        for (const [connector, tail] of tails) {
          if (!tail.dirty) continue;
          tail.dirty = false;
          while (tail.horizon < upTo && tail.members.size > 0) {
            const rows = await rowsUpTo(connector, tail.horizon, upTo);
            deliver(tail, rows);
            tail.horizon = rows.length === batch ? (rows.at(-1)?.seq ?? upTo) : upTo;
          }
        }
      }
    } finally {
      pumping = false;
    }
  };
  const pumpSoon = (): void => {
    void pump().catch(() => {
      // A failed read leaves the tails dirty; the next notification or poll tries again.
      for (const tail of tails.values()) tail.dirty = true;
    });
  };

  const unsubscribe = hub.subscribe("keel_emissions", (connector) => {
    if (connector === "") for (const tail of tails.values()) tail.dirty = true;
    else {
      const tail = tails.get(connector);
      if (tail === undefined) return;
      tail.dirty = true;
    }
    pumpSoon();
  });
  const poll = setInterval(() => {
    if (tails.size === 0) return;
    for (const tail of tails.values()) tail.dirty = true;
    pumpSoon();
  }, options.pollMs);
  poll.unref();

  /** Waits until the member leaves the tail or the signal aborts (whose listener calls wake too). */
  const untilLeft = (member: TailMember): Promise<void> =>
    new Promise((resolve) => {
      member.wake = () => {
        member.wake = undefined;
        resolve();
      };
    });

  const pipe = async (connector: string, afterSeq: number, signal: AbortSignal, sink: EmissionSink): Promise<void> => {
    let cursor = afterSeq;
    while (!signal.aborted) {
      // Catch up alone, below a settled horizon: no lock, nothing committed late is skipped.
      const upTo = horizon > cursor ? horizon : await readHorizon();
      const rows = await rowsUpTo(connector, cursor, upTo);
      for (const row of rows) {
        if (signal.aborted) return;
        const wait = sink(row);
        cursor = row.seq;
        if (wait !== undefined) await untilSettledOrAborted(wait, signal);
      }
      if (rows.length === batch) continue;
      let tail = tails.get(connector);
      if (tail === undefined) {
        tail = { horizon: upTo, dirty: true, members: new Set() };
        tails.set(connector, tail);
      }
      // The tail was read past what this stream read: read up to there first.
      if (tail.horizon > upTo) continue;
      const member: TailMember = { sink, cursor, behind: undefined, failure: undefined, left: false, wake: undefined };
      const onAbort = (): void => member.wake?.();
      signal.addEventListener("abort", onAbort, { once: true });
      tail.members.add(member);
      pumpSoon();
      try {
        while (!signal.aborted && !member.left) await untilLeft(member);
      } finally {
        signal.removeEventListener("abort", onAbort);
        tail.members.delete(member);
        if (tail.members.size === 0 && tails.get(connector) === tail) tails.delete(connector);
      }
      cursor = member.cursor;
      if (member.failure !== undefined) throw member.failure;
      if (member.behind !== undefined) await untilSettledOrAborted(member.behind, signal);
    }
  };

  return {
    pipe,
    async *follow(connector, afterSeq, signal) {
      // The pipe runs ahead of this reader by at most maxQueued rows, then waits for it.
      const stop = new AbortController();
      const onAbort = () => stop.abort();
      signal.addEventListener("abort", onAbort, { once: true });
      if (signal.aborted) stop.abort();
      const queue: EmissionRecord[] = [];
      let head = 0;
      let wake: (() => void) | undefined;
      let room: { promise: Promise<void>; resolve: () => void } | undefined;
      let ended = false;
      let failure: Error | undefined;
      const rouse = () => {
        const waiting = wake;
        wake = undefined;
        waiting?.();
      };
      void pipe(connector, afterSeq, stop.signal, (row) => {
        queue.push(row);
        rouse();
        if (queue.length - head < maxQueued) return undefined;
        if (room === undefined) {
          let resolve = () => {};
          room = { promise: new Promise<void>((r) => (resolve = r)), resolve };
        }
        return room.promise;
      }).then(
        () => (ended = true),
        (error: unknown) => ((failure = asError(error)), (ended = true)),
      ).finally(rouse);
      try {
        for (;;) {
          if (head < queue.length) {
            const row = queue[head++] as EmissionRecord;
            if (head === queue.length) {
              queue.length = 0;
              head = 0;
              room?.resolve();
              room = undefined;
            }
            const turn = pacer.take();
            if (turn !== undefined) await turn;
            yield row;
          } else if (ended) {
            if (failure !== undefined) throw failure;
            return;
          } else await new Promise<void>((resolve) => (wake = resolve));
        }
      } finally {
        signal.removeEventListener("abort", onAbort);
        stop.abort();
        // The pipe ends with its current read; `piping` is not awaited (it settles without throwing).
        room?.resolve();
      }
    },
    close() {
      clearInterval(poll);
      unsubscribe();
      for (const tail of tails.values()) for (const member of tail.members) member.wake?.();
    },
  };
}
