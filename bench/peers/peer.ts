// What the peers bench asks of each system: run the loop workload (one instant model turn and
// one instant read tool per iteration, each recorded durably as the system does it) and report
// when each iteration starts, so every system is timed the same way.
import { performance } from "node:perf_hooks";
import type { Durability } from "../support.js";
import { summarize, type Stats } from "../support.js";

export interface Peer {
  /** Runs one loop of the peer's iterations to its end, calling `iterationStarted` as each begins. */
  runLoop(iterationStarted: () => void): Promise<void>;
  stop(): Promise<void>;
}

/** A system the bench compares: its name in the table and how it starts in a mode. */
export interface PeerKind {
  readonly name: string;
  /** How the system was set up for the mode, for the table's notes. */
  describe(durability: Durability): string;
  start(durability: Durability, iterations: number): Promise<Peer>;
}

export interface PeerFigures {
  readonly single: Stats;
  readonly perSecond: number;
  readonly iterations: number;
}

export interface MeasureOptions {
  readonly iterations: number;
  readonly concurrent: number;
  /** Untimed rounds first, each a loop alone and then `concurrent` loops at once. */
  readonly warmupRounds: number;
}

/**
 * p50/p99 of the gap between consecutive iteration starts of one loop run alone (each gap is
 * one whole iteration), then iterations per second with `concurrent` loops at once (wall clock
 * from the first start to the last loop's end). Untimed warm-up rounds of both shapes come
 * first, the same for every system, so each is timed in its steady state rather than while its
 * process still compiles the hot path or its connections still plan their statements (Keel's
 * throughput rose by about a fifth from the first concurrent round to the fourth).
 */
export async function measure(peer: Peer, options: MeasureOptions): Promise<PeerFigures> {
  for (let i = 0; i < options.warmupRounds; i++) {
    await peer.runLoop(() => {});
    await Promise.all(Array.from({ length: options.concurrent }, () => peer.runLoop(() => {})));
  }
  const starts: number[] = [];
  await peer.runLoop(() => starts.push(performance.now()));
  const gaps = starts.slice(1).map((t, i) => t - starts[i]!);
  const began = performance.now();
  await Promise.all(Array.from({ length: options.concurrent }, () => peer.runLoop(() => {})));
  const done = options.concurrent * options.iterations;
  const perSecond = done / ((performance.now() - began) / 1000);
  return { single: summarize(gaps), perSecond, iterations: done };
}

/** Node 20 has no Promise.withResolvers, which the Restate SDK calls; the ES2024 behaviour. */
export function polyfillPromiseWithResolvers(): void {
  const ctor = Promise as unknown as { withResolvers?: unknown };
  if (typeof ctor.withResolvers === "function") return;
  ctor.withResolvers = function withResolvers<T>() {
    let resolve!: (value: T | PromiseLike<T>) => void;
    let reject!: (reason?: unknown) => void;
    const promise = new Promise<T>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

/** The bench's own PostgreSQL with another database name in its URL (the socket folder and password stay). */
export function withDatabase(url: string, database: string): string {
  return url.replace(/\/[^/?]+(\?|$)/, `/${database}$1`);
}
