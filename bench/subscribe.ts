// Subscribe benchmark: does the number of open Subscribe streams slow the commits that write
// emissions? The same emission commits (one emission per transaction, through the ledger's
// reserveEmissions as step commits do) are timed with 1 stream open and with N streams open over
// real HTTP/2 (Connect clients in a process of their own, several sessions and tokens), spread over several connectors,
// each emission going to one connector in turn (with 1 stream, all to its connector). Every stream must receive every emission of its
// connector, once and in order. Target: p50 with N streams <= 1.5x p50 with 1, at the same offered
// load: commits paced at --rate a second in both rounds, each timed from its start. A round with
// the commits back to back shows capacity: there the deliveries asked for grow as commits get
// faster, until one process's sending is the bound. A control round with the N streams still open
// commits emissions to a connector none of them follows: what the open streams cost commits when
// nothing is delivered, against what delivering to them costs.
//
// KEEL_BENCH_PROFILE_DIR writes a CPU profile of the server over the paced round with N streams open.
//
//   npm run bench -- subscribe [--streams 2000] [--connectors 20] [--emissions 400] [--rate 200] [--durability strict|relaxed]
import { randomUUID } from "node:crypto";
import { monitorEventLoopDelay, performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { execFileSync, fork, type ChildProcess } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { sql as sqlText } from "../control-plane/src/ledger/sql.js";
import type { CheckRequest, ChildReply, OpenRequest } from "./subscribe/streams-child.js";
import {
  integerOption,
  benchDurability,
  DURABILITY_OPTION,
  durabilityLabel,
  durabilitySettings,
  ms,
  startBenchKeel,
  summarize,
  table,
  withBenchPostgres,
  type BenchKeel,
  type Stats,
  verdict,
} from "./support.js";
import { startProfile } from "./sandbox/cpu-meter.js";

const STREAMS_PER_SESSION = 50;
const STREAMS_PER_TOKEN = 250;

interface Options {
  readonly streams: number;
  readonly connectors: number;
  readonly emissions: number;
  /** Emission commits a second in the paced rounds. */
  readonly rate: number;
  readonly durability: ReturnType<typeof benchDurability>;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      streams: { type: "string", default: "2000" },
      connectors: { type: "string", default: "20" },
      emissions: { type: "string", default: "400" },
      rate: { type: "string", default: "200" },
      ...DURABILITY_OPTION,
    },
  });
  return {
    streams: integerOption("streams", values.streams, 1),
    connectors: integerOption("connectors", values.connectors, 1),
    emissions: integerOption("emissions", values.emissions, 1),
    rate: integerOption("rate", values.rate, 1),
    durability: benchDurability(values.durability),
  };
}

/**
 * Connectors run on machines of their own; here their 2,000 streams share the server's CPUs, and
 * decoding them costs about what sending them does. So that they cannot take the CPU the measured
 * commits need, the clients' process gets the lowest priority and (with at least two CPUs and
 * taskset) the last CPU only, in both phases alike.
 */
function isolateClients(pid: number | undefined): string {
  if (pid === undefined) return "stream clients not isolated (no pid)";
  const parts: string[] = [];
  try {
    os.setPriority(pid, 19);
    parts.push("nice 19");
  } catch {
    parts.push("priority unchanged");
  }
  const cpus = os.availableParallelism();
  try {
    if (cpus < 2) throw new Error("one CPU");
    execFileSync("taskset", ["-a", "-p", "-c", String(cpus - 1), String(pid)], { stdio: "ignore" });
    parts.push(`pinned to CPU ${cpus - 1} of ${cpus} (taskset)`);
  } catch {
    parts.push("not pinned");
  }
  return `stream clients ${parts.join(", ")}; server and PostgreSQL unchanged`;
}

/** The stream clients' process (bench/subscribe/streams-child.ts), driven over IPC. */
class StreamClients {
  private readonly child: ChildProcess;
  private readonly replies: ChildReply[] = [];
  private waiting: (() => void) | undefined;
  readonly pinning: string;

  constructor() {
    this.child = fork(path.join(path.dirname(fileURLToPath(import.meta.url)), "subscribe", "streams-child.ts"), [], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    this.pinning = isolateClients(this.child.pid);
    this.child.on("message", (message: ChildReply) => {
      this.replies.push(message);
      this.waiting?.();
    });
  }

  private async ask(request: OpenRequest | CheckRequest | { kind: "close" }): Promise<ChildReply> {
    this.child.send(request);
    while (this.replies.length === 0) await new Promise<void>((resolve) => (this.waiting = resolve));
    return this.replies.shift() as ChildReply;
  }

  async open(request: Omit<OpenRequest, "kind">): Promise<void> {
    await this.ask({ kind: "open", ...request });
  }

  /** Throws unless every stream received exactly what was sent to its connector; returns the clients' CPU time (us) since opening. */
  async check(expected: (connector: string) => readonly string[], connectors: readonly string[], timeoutMs: number): Promise<number> {
    const answer = await this.ask({ kind: "check", expected: Object.fromEntries(connectors.map((c) => [c, expected(c)])), timeoutMs });
    if (answer.kind !== "checked") throw new Error(`stream clients answered ${answer.kind} to a check`);
    if (answer.error !== undefined) throw new Error(answer.error);
    return answer.cpuUs;
  }

  async close(): Promise<void> {
    await this.ask({ kind: "close" });
  }
}

export default async function subscribeBench(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const progress = (line: string) => process.stderr.write(`[subscribe] ${line}\n`);
  await withBenchPostgres("subscribe", progress, async (postgres) => {
    const keel = await startBenchKeel(postgres, DEMO_AGENT, options.durability);
    try {
      const db = new pg.Client({ connectionString: postgres.url });
      await db.connect();
      const settings = await durabilitySettings(db).finally(() => db.end());
      progress(`keel on ${keel.url}; ${durabilityLabel(options.durability)}; postgres ${settings}`);
      const connectors = Array.from({ length: options.connectors }, (_, i) => `bench-${i}`);
      const targets = await seedRuns(keel, connectors);
      const [unfollowed] = await seedRuns(keel, ["bench-unfollowed"]);
      const sent = new Map<string, string[]>(connectors.map((c) => [c, []]));
      let n = 0;
      /**
       * Commits `count` emissions, one per transaction, to `to` in turn: each at its slot of `rate`
       * a second (or when the last one ends, if later), or back to back without a rate. Returns
       * each commit's latency from its start, and the commits per second achieved.
       */
      const emitRound = async (count: number, to: readonly EmissionTarget[], rate?: number): Promise<Round> => {
        const latencies: number[] = [];
        const began = performance.now();
        for (let i = 0; i < count; i++) {
          if (rate !== undefined) {
            const wait = began + (i * 1000) / rate - performance.now();
            if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
          }
          const target = to[n % to.length] as EmissionTarget;
          const text = `emission ${n++}`;
          const started = performance.now();
          await keel.app.ledger.sql.transaction((trx) =>
            reserveEmissions(trx, target, [{ kind: "progress", idempotencyKey: `${target.connector}:${text}`, text, addressedActorIds: [] }]),
          );
          latencies.push(performance.now() - started);
          sent.get(target.connector)?.push(text);
        }
        return { ...summarize(latencies), perSecond: (count * 1000) / (performance.now() - began) };
      };

      const tokens = await Promise.all(
        Array.from({ length: Math.ceil(options.streams / STREAMS_PER_TOKEN) }, async (_, i) => (await keel.app.tokens.create("connector", `bench-subscribe-${i}`, { scope: { kind: "connector", connectors: connectors, agents: "any" } })).secret),
      );
      await emitRound(50, targets); // warm-up, before any stream
      /**
       * Waits, by a condition rather than a fixed sleep, until every stream is open and at its tail:
       * one emission per connector, received by all its streams. Opening 2,000 streams (token checks,
       * catch-up reads, the response headers sent with the first message) is then done before timing.
       */
      const prime = async (clients: StreamClients, to: readonly string[], since: (connector: string) => readonly string[]): Promise<void> => {
        await emitRound(to.length, targets.filter((t) => to.includes(t.connector)));
        await clients.check(since, to, 120_000);
      };
      /** What each connector was sent after this point. */
      const sentSince = () => {
        const from = new Map([...sent].map(([c, texts]) => [c, texts.length]));
        return (connector: string) => (sent.get(connector) ?? []).slice(from.get(connector) ?? 0);
      };

      const one = new StreamClients();
      const first = connectors.slice(0, 1);
      const primedOne = sentSince();
      await one.open({ url: keel.url, tokens, connectors: first, streams: 1, afterSeq: String(await lastSeq(keel)), streamsPerSession: STREAMS_PER_SESSION, streamsPerToken: STREAMS_PER_TOKEN });
      await prime(one, first, primedOne);
      const sentToOne = sentSince();
      // Every emission goes to the one stream's connector, so each is read and delivered, as in the crowd.
      const singleCost = startCost();
      const single = await emitRound(options.emissions, targets.slice(0, 1), options.rate);
      const oneCpu = await one.check(sentToOne, first, 30_000);
      const sentFlatToOne = sentSince();
      const singleFlatOut = await emitRound(options.emissions, targets.slice(0, 1));
      await one.check(sentFlatToOne, first, 30_000);
      await one.close();
      progress(`1 stream: ${single.n} emission commits, all delivered; ${singleCost(single.n)}; clients ${(oneCpu / single.n).toFixed(0)} us CPU per delivery; ${one.pinning}`);

      const many = new StreamClients();
      const primedMany = sentSince();
      await many.open({ url: keel.url, tokens, connectors, streams: options.streams, afterSeq: String(await lastSeq(keel)), streamsPerSession: STREAMS_PER_SESSION, streamsPerToken: STREAMS_PER_TOKEN });
      await prime(many, connectors, primedMany);
      const sentToMany = sentSince();
      const crowdedCost = startCost();
      const profile = await startProfile("subscribe-crowded");
      const crowded = await emitRound(options.emissions, targets, options.rate);
      await profile?.stop(progress);
      const manyCpu = await many.check(sentToMany, connectors, 60_000);
      const fanOut = Math.round(options.streams / options.connectors);
      const deliveries = crowded.n * fanOut;
      progress(`${options.streams} streams: ${crowded.n} emission commits, all delivered to every stream of their connector; ${crowdedCost(deliveries)}; clients ${(manyCpu / deliveries).toFixed(0)} us CPU per delivery; ${many.pinning}`);
      const sentFlat = sentSince();
      const flatOut = await emitRound(options.emissions, targets);
      await many.check(sentFlat, connectors, 60_000);
      progress(`${options.streams} streams: ${flatOut.n} emission commits back to back, all delivered`);
      const quiet = await emitRound(options.emissions, [unfollowed!], options.rate);
      progress(`${options.streams} streams open: ${quiet.n} emission commits to a connector none of them follows (control)`);
      await many.close();

      printResult(options, { single, crowded, singleFlatOut, flatOut, quiet }, fanOut, one.pinning === many.pinning ? one.pinning : `${one.pinning} / ${many.pinning}`);
    } finally {
      await keel.app.stop();
    }
  });
}

/**
 * The server process's CPU time per delivery and its event-loop delay, from now until the returned
 * function is called: a diagnosis that the machine's other load does not blur as latency does.
 */
function startCost(): (deliveries: number) => string {
  const cpu = process.cpuUsage();
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  return (deliveries) => {
    delay.disable();
    const used = process.cpuUsage(cpu);
    const perDelivery = (used.user + used.system) / Math.max(1, deliveries);
    return `server CPU ${perDelivery.toFixed(0)} us per delivery (commits included), event-loop delay p50 ${(delay.percentile(50) / 1e6).toFixed(2)} ms p99 ${(delay.percentile(99) / 1e6).toFixed(2)} ms`;
  };
}

interface Round extends Stats {
  readonly perSecond: number;
}

function printResult(options: Options, rounds: Record<"single" | "crowded" | "singleFlatOut" | "flatOut" | "quiet", Round>, fanOut: number, pinning: string): void {
  const { single, crowded, singleFlatOut, flatOut, quiet } = rounds;
  const ratio = crowded.p50 / single.p50;
  const flatOutRatio = flatOut.p50 / singleFlatOut.p50;
  const row = (metric: string, round: Round, streamsPerEmission: number) => [
    metric,
    ms(round.p50),
    ms(round.p99),
    String(round.n),
    round.perSecond.toFixed(0),
    (round.perSecond * streamsPerEmission).toFixed(0),
  ];
  const lines = [
    "",
    `subscribe: emission commit latency (one emission per transaction, reserveEmissions as step commits write them) with 1 open Subscribe stream ` +
      `and with ${options.streams} over ${options.connectors} connectors (${fanOut} streams each); ${durabilityLabel(options.durability)}`,
    `paced rounds: one commit every ${(1000 / options.rate).toFixed(1)} ms (${options.rate}/s, or when the last ends if later), timed from its start; both phases: ${pinning}`,
    "",
    ...table(
      ["metric", "p50_ms", "p99_ms", "n", "commits/s", "deliveries/s"],
      [
        row(`emission commit, 1 stream open, paced`, single, 1),
        row(`emission commit, ${options.streams} streams open, paced`, crowded, fanOut),
        row(`emission commit, 1 stream open, back to back`, singleFlatOut, 1),
        row(`emission commit, ${options.streams} streams open, back to back`, flatOut, fanOut),
        row(`control: ${options.streams} open, none receiving`, quiet, 0),
      ],
    ),
    "",
    `target: p50 with ${options.streams} streams <= 1.5x p50 with 1: paced ${ratio.toFixed(2)}x ${verdict(ratio <= 1.5)}; back to back ${flatOutRatio.toFixed(2)}x ${verdict(flatOutRatio <= 1.5)}`,
    `RESULT streams=${options.streams} rate=${options.rate} p50_1_ms=${ms(single.p50)} p50_many_ms=${ms(crowded.p50)} p99_1_ms=${ms(single.p99)} p99_many_ms=${ms(crowded.p99)} ratio=${ratio.toFixed(2)} ` +
      `back_to_back_p50_1_ms=${ms(singleFlatOut.p50)} back_to_back_p50_many_ms=${ms(flatOut.p50)} back_to_back_ratio=${flatOutRatio.toFixed(2)} back_to_back_deliveries_per_s=${(flatOut.perSecond * fanOut).toFixed(0)}`,
  ];
  process.stdout.write(`${lines.join("\n")}\n`);
}

/** A finished run per connector for the emissions to belong to (the ledger's foreign keys). */
async function seedRuns(keel: BenchKeel, connectors: readonly string[]): Promise<EmissionTarget[]> {
  await keel.app.ledger.sql.query(sqlText`INSERT INTO actors (id) VALUES ('bench-subscribe') ON CONFLICT DO NOTHING`);
  const targets: EmissionTarget[] = [];
  for (const connector of connectors) {
    const target: EmissionTarget = { runId: randomUUID(), agentId: DEMO_AGENT.id, conversationId: randomUUID(), externalConversationId: connector, connector };
    await keel.app.ledger.sql.query(sqlText`
      WITH conversation AS (
        INSERT INTO conversations (id, agent_id, external_id, connector)
        VALUES (${target.conversationId}, ${target.agentId}, ${target.externalConversationId}, ${connector}))
      INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage)
      VALUES (${target.runId}, ${target.agentId}, ${target.conversationId}, ${connector}, 'succeeded', 'bench-subscribe', '{}', '{}')`);
    targets.push(target);
  }
  return targets;
}

async function lastSeq(keel: BenchKeel): Promise<number> {
  const [row] = await keel.app.ledger.sql.query<{ seq: string }>(sqlText`SELECT coalesce(max(seq), 0)::text AS seq FROM emissions`);
  return Number(row?.seq ?? 0);
}
