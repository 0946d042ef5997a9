// What the peers bench asks of each system: run the loop workload (one instant model turn and
// one instant read tool per iteration, each recorded durably as the system does it) and report
// when each iteration starts, so every system is timed the same way.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import type { Durability } from "../support.js";
import { median, summarize, type Stats } from "../support.js";

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
  /** Timed rounds; in each, every system runs one loop alone and then `concurrent` at once. */
  readonly rounds: number;
}

/** One timed round of one system: its lone loop's iteration gaps and its concurrent loops' rate. */
export interface RoundFigures {
  readonly gaps: readonly number[];
  readonly perSecond: number;
}

/**
 * Every system, each already started, timed in the same rounds: in each round every system runs
 * one loop alone (each gap between consecutive iteration starts is one whole iteration), then
 * every system runs `concurrent` loops at once (iterations per second, wall clock from the first
 * start to the last loop's end). The systems take turns within a round, so a stretch when the
 * machine runs slow lands on all of them alike: measured one after another instead, a 2-core VM's
 * drift of a fifth over minutes decided which system looked faster. Two things keep one system's
 * turn from taxing the next: each turn starts on a quiet machine (quiet()), since a system goes on
 * working after its turn ends (Restate's server flushing its log, PostgreSQL's WAL writer), and
 * the order turns around every other round, so each system follows each of its neighbours as
 * often. Untimed warm-up rounds of both shapes come first, the same for every system, so each is
 * timed in its steady state rather than while its process still compiles the hot path or its
 * connections still plan their statements.
 */
export async function measureTogether<Name extends string>(
  peers: ReadonlyMap<Name, Peer>,
  options: MeasureOptions,
  progress: (line: string) => void,
): Promise<Map<Name, RoundFigures[]>> {
  const alone = async (peer: Peer): Promise<number[]> => {
    await quiet();
    const starts: number[] = [];
    await peer.runLoop(() => starts.push(performance.now()));
    return starts.slice(1).map((t, i) => t - starts[i]!);
  };
  const together = async (peer: Peer): Promise<number> => {
    await quiet();
    const began = performance.now();
    await Promise.all(Array.from({ length: options.concurrent }, () => peer.runLoop(() => {})));
    return (options.concurrent * options.iterations) / ((performance.now() - began) / 1000);
  };
  for (const [name, peer] of peers) {
    progress(`${name}: warming up`);
    for (let i = 0; i < options.warmupRounds; i++) {
      await alone(peer);
      await together(peer);
    }
  }
  const names = [...peers.keys()];
  const rounds = new Map<Name, RoundFigures[]>(names.map((name) => [name, []]));
  for (let round = 0; round < options.rounds; round++) {
    const turned = names.map((_, i) => names[(i + round) % names.length]!);
    const order = round % 2 === 0 ? turned : turned.reverse();
    const gaps = new Map<Name, number[]>();
    for (const name of order) gaps.set(name, await alone(peers.get(name)!));
    for (const name of order) rounds.get(name)!.push({ gaps: gaps.get(name)!, perSecond: await together(peers.get(name)!) });
    progress(`round ${round + 1}/${options.rounds}: ${order.map((name) => `${name} ${summarize(gaps.get(name)!).p50.toFixed(2)} ms`).join(", ")}`);
  }
  return rounds;
}

/** The machine's busy and total CPU time so far, in clock ticks (Linux); undefined elsewhere. */
function cpuTicks(): { readonly busy: number; readonly total: number } | undefined {
  try {
    const fields = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    const total = fields.reduce((sum, n) => sum + n, 0);
    return { busy: total - fields[3]! - fields[4]!, total };
  } catch {
    return undefined;
  }
}

/** A turn's CPU may be at most this busy, over a tenth of a second, for the machine to count as quiet. */
const QUIET_BUSY = 0.1;
const QUIET_WINDOW_MS = 100;
/** The longest a turn waits for quiet: a machine that never settles is timed as it is. */
const QUIET_LIMIT_MS = 3_000;

/** Resolves when the machine's CPU has been idle for a moment (or after QUIET_LIMIT_MS). */
async function quiet(): Promise<void> {
  const deadline = performance.now() + QUIET_LIMIT_MS;
  let before = cpuTicks();
  if (before === undefined) return new Promise((resolve) => setTimeout(resolve, QUIET_WINDOW_MS));
  while (performance.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, QUIET_WINDOW_MS));
    const now = cpuTicks()!;
    const total = now.total - before.total;
    if (total > 0 && (now.busy - before.busy) / total <= QUIET_BUSY) return;
    before = now;
  }
}

/** A system's figures over the rounds: percentiles of all its lone iterations, the median round's rate. */
export function overRounds(rounds: readonly RoundFigures[], options: Pick<MeasureOptions, "iterations" | "concurrent">): PeerFigures {
  return {
    single: summarize(rounds.flatMap((round) => round.gaps)),
    perSecond: median(rounds.map((round) => round.perSecond)),
    iterations: options.concurrent * options.iterations,
  };
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
