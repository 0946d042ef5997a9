// Peers benchmark: the loop workload (one instant model turn and one instant read tool per
// iteration, each recorded durably) through Keel, Restate and DBOS Transact, beside a raw
// two-row PostgreSQL transaction, in one sitting and in each durability mode: strict (every
// system flushes what it records before going on) and relaxed (Keel's relaxed mode, PostgreSQL's
// synchronous_commit off for DBOS and raw, Restate's log fsync off). Per system: p50/p99 of one
// iteration with one loop running alone, and iterations/s with --concurrent loops at once.
// A peer that cannot start is skipped with its reason. Every system of a mode is started first
// and then timed in --rounds interleaved rounds (peers/peer.ts, measureTogether): each round
// runs every system's lone loop and then every system's concurrent loops, so the machine's
// drift lands on all systems alike. p50/p99 are over all rounds' lone iterations, throughput is
// the median round's, and each round's figures are printed beside them.
//
//   npm run bench -- peers [--iterations 100] [--concurrent 16] [--warmup 3] [--durability strict|relaxed|both]
//                          [--peers keel,restate,dbos,raw] [--rounds 8]
import { parseArgs } from "node:util";
import { allowHeapGrowthForStreaming } from "../control-plane/src/heap-growth.js";
import { dbosPeer, shutDownDbos } from "./peers/dbos-peer.js";
import { keelPeer } from "./peers/keel-peer.js";
import { measureTogether, overRounds, type Peer, type PeerFigures, type PeerKind, type RoundFigures } from "./peers/peer.js";
import { rawPeer } from "./peers/raw-peer.js";
import { closeRestateEndpoint, restatePeer } from "./peers/restate-peer.js";
import { integerOption, benchDurability, durabilitySettings, ms, summarize, table, withBenchPostgres, type Durability, verdict, BenchUsageError } from "./support.js";
import pg from "pg";

/** The issue's bar: Keel's p50 at most these fractions of each peer's, its throughput at least these multiples. */
const TARGETS = { restate: { p50: 0.8, tput: 1.2 }, dbos: { p50: 0.5, tput: 2 } } as const;
const NAMES = ["keel", "restate", "dbos", "raw"] as const;
type Name = (typeof NAMES)[number];

interface Options {
  readonly iterations: number;
  readonly concurrent: number;
  readonly warmup: number;
  readonly modes: readonly Durability[];
  readonly peers: readonly Name[];
  readonly rounds: number;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      iterations: { type: "string", default: "100" },
      concurrent: { type: "string", default: "16" },
      warmup: { type: "string", default: "3" },
      durability: { type: "string", default: "both" },
      peers: { type: "string", default: NAMES.join(",") },
      rounds: { type: "string", default: "8" },
    },
  });
  const peers = values.peers.split(",").map((name) => name.trim());
  for (const name of peers) if (!(NAMES as readonly string[]).includes(name)) throw new BenchUsageError(`--peers: unknown peer ${JSON.stringify(name)} (known: ${NAMES.join(", ")})`);
  return {
    iterations: integerOption("iterations", values.iterations, 2),
    concurrent: integerOption("concurrent", values.concurrent, 1),
    warmup: integerOption("warmup", values.warmup, 0),
    modes: values.durability === "both" ? ["strict", "relaxed"] : [benchDurability(values.durability)],
    peers: peers as Name[],
    rounds: integerOption("rounds", values.rounds, 1),
  };
}

type Outcome = { readonly rounds: readonly RoundFigures[]; readonly setup: string } | { readonly skipped: string };

export default async function peersBench(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const progress = (line: string) => process.stderr.write(`[peers] ${line}\n`);
  allowHeapGrowthForStreaming();

  // A connection DBOS keeps past its shutdown has no error listener: when the bench stops
  // PostgreSQL, its "terminating connection due to administrator command" (57P01) would end the
  // process after the results. That one error is expected at teardown; any other still throws.
  const strayDisconnect = (error: Error & { code?: string }): void => {
    if (error.code !== "57P01") throw error;
  };
  process.on("uncaughtException", strayDisconnect);
  await withBenchPostgres("peers", progress, async (postgres) => {
    const kinds: Record<Name, PeerKind> = {
      keel: keelPeer(postgres.url, options.concurrent),
      restate: restatePeer(),
      dbos: dbosPeer(postgres.url, options.concurrent),
      raw: rawPeer(postgres.url, options.concurrent),
    };
    const db = new pg.Client({ connectionString: postgres.url });
    await db.connect();
    const settings = await durabilitySettings(db).finally(() => db.end());
    const lines: string[] = [];
    try {
      for (const mode of options.modes) lines.push(...report(mode, await measureMode(kinds, mode, options, progress), options, settings));
    } finally {
      await shutDownDbos().catch((error: unknown) => progress(`stopping DBOS: ${String(error)}`));
      await closeRestateEndpoint();
    }
    process.stdout.write(`${lines.join("\n")}\n`);
  });
  // Stray disconnects arrive as PostgreSQL stops; let them land before the handler goes.
  await new Promise((resolve) => setTimeout(resolve, 200));
  process.off("uncaughtException", strayDisconnect);
}

/** Starts every system in the mode (skipping, with its reason, one that cannot start), times them together, stops them. */
async function measureMode(kinds: Record<Name, PeerKind>, mode: Durability, options: Options, progress: (line: string) => void): Promise<Map<Name, Outcome>> {
  const started = new Map<Name, Peer>();
  const outcomes = new Map<Name, Outcome>();
  try {
    for (const name of options.peers) {
      const kind = kinds[name];
      progress(`${mode}: starting ${kind.name} (${kind.describe(mode)})`);
      try {
        started.set(name, await kind.start(mode, options.iterations));
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        progress(`${kind.name} skipped: ${reason}`);
        outcomes.set(name, { skipped: reason.split("\n")[0] ?? reason });
      }
    }
    const rounds = await measureTogether(started, { ...options, warmupRounds: options.warmup }, (line) => progress(`${mode}: ${line}`));
    for (const name of options.peers) {
      const each = rounds.get(name);
      if (each !== undefined) outcomes.set(name, { rounds: each, setup: kinds[name].describe(mode) });
    }
    // The table keeps the order the peers were asked in.
    return new Map(options.peers.map((name) => [name, outcomes.get(name)!]));
  } finally {
    for (const peer of started.values()) await peer.stop();
  }
}

function report(mode: Durability, outcomes: ReadonlyMap<Name, Outcome>, options: Options, settings: string): string[] {
  const measured = new Map<Name, PeerFigures>();
  for (const [name, outcome] of outcomes) if ("rounds" in outcome) measured.set(name, overRounds(outcome.rounds, options));
  const rows = [...outcomes].map(([name, outcome]) => {
    if ("skipped" in outcome) return [name, "-", "-", "-", `skipped: ${outcome.skipped}`];
    const of = measured.get(name)!;
    return [name === "raw" ? "raw PostgreSQL, 2-row txn" : name, ms(of.single.p50), ms(of.single.p99), of.perSecond.toFixed(1), outcome.setup];
  });
  const keel = measured.get("keel");
  const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined ? "NA" : (a / b).toFixed(2));
  const value = (n: number | undefined, digits: number) => (n === undefined ? "NA" : n.toFixed(digits));
  const verdicts = (["restate", "dbos"] as const).map((peer) => {
    const other = measured.get(peer);
    if (keel === undefined || other === undefined) return `${peer}: not measured`;
    const p50 = keel.single.p50 / other.single.p50;
    const tput = keel.perSecond / other.perSecond;
    const ok = p50 <= TARGETS[peer].p50 && tput >= TARGETS[peer].tput;
    return `${peer}: p50 ${p50.toFixed(2)}x (<= ${TARGETS[peer].p50}), throughput ${tput.toFixed(2)}x (>= ${TARGETS[peer].tput}) ${verdict(ok)}`;
  });
  const restate = measured.get("restate");
  const dbos = measured.get("dbos");
  return [
    "",
    `peers, mode=${mode}: ${options.iterations} iterations per loop (one instant model turn + one instant read tool), 1 loop alone, then ${options.concurrent} at once; ` +
      `${options.warmup} warm-up round(s) of both shapes each; embedded PostgreSQL 17 (${settings}); ` +
      `${options.rounds} interleaved round(s): p50/p99 over every round's lone loop, throughput the median round's`,
    "",
    ...table(["system", "p50_ms", "p99_ms", `iterations/s, ${options.concurrent} loops`, "setup"], rows),
    ...(options.rounds > 1 ? ["", ...eachRound(outcomes)] : []),
    "",
    `targets (keel against each peer): ${verdicts.join("; ")}`,
    `RESULT mode=${mode} keel_p50_ms=${value(keel?.single.p50, 2)} restate_p50_ms=${value(restate?.single.p50, 2)} dbos_p50_ms=${value(dbos?.single.p50, 2)} ` +
      `keel_per_s=${value(keel?.perSecond, 1)} restate_per_s=${value(restate?.perSecond, 1)} dbos_per_s=${value(dbos?.perSecond, 1)} ` +
      `vs_restate_p50=${ratio(keel?.single.p50, restate?.single.p50)} vs_restate_tput=${ratio(keel?.perSecond, restate?.perSecond)} ` +
      `vs_dbos_p50=${ratio(keel?.single.p50, dbos?.single.p50)} vs_dbos_tput=${ratio(keel?.perSecond, dbos?.perSecond)}`,
  ];
}

/** Each system's figures round by round (the lone loop's p50 ms / iterations/s), beside the totals. */
function eachRound(outcomes: ReadonlyMap<Name, Outcome>): string[] {
  return [...outcomes].map(([name, outcome]) =>
    "rounds" in outcome
      ? `${name} by round: ${outcome.rounds.map((round) => `${ms(summarize(round.gaps).p50)} ms / ${round.perSecond.toFixed(1)}/s`).join(", ")}`
      : `${name}: skipped`,
  );
}
