// Progress benchmark: N concurrent supervised runs on a manual clock, their notices reserved in
// fenced transactions and delivered through Subscribe with AcknowledgeEmission, beside a raw
// PostgreSQL baseline of the same rows in the same run.
//
// The runs are claimed running rows (lease held by this process) with one real supervisor each
// (progress/progress-supervisor.ts, the reservation of ledger/progress.repository.ts); no model
// is called (no summarizer: notices give the ledger's facts), so what is timed is the
// supervisor, the fenced reservation and the delivery path. Phases:
//   1. the clock moves 60 s with no stream open: every run reserves its first notice. The
//      process's CPU over that (supervisor looks + reservations) per run is the RESULT's
//      supervisor_cpu_ms_per_tick; PostgreSQL's is printed beside it.
//   2. idle looks: two seconds with nothing due (CPU per run per look); then SubmitMessage is
//      timed while the supervisors keep looking (ingress p50/p99; no workers, so admission only).
//   3. a connector in a process of its own (bench/progress/connector-child.ts), as a real one is,
//      opens a Subscribe stream and drains phase 1's notices, acknowledging each DELIVERED.
//   4. three rounds of: the clock moves 3 min, each run reserves, the stream delivers and the
//      connector acknowledges its next notice (N / elapsed); then the raw baseline: the same rows
//      (progress_events + emissions) inserted by one transaction per notice with a NOTIFY, a
//      LISTEN client updating each emission to delivered, on 16 connections. emissions_per_s and
//      raw_per_s are the medians, emission_ratio the median of each round's ratio; the CPU per
//      notice of this process, PostgreSQL and the connector is printed beside them.
//
// --ack-batch 1 acknowledges with one AcknowledgeEmission call per notice (32 calls in flight
// unless --acks says otherwise); the default batches into AcknowledgeEmissions (4 in flight).
//
//   npm run bench -- progress [--runs 1000] [--tick-ms 50] [--probes 200] [--ack-batch 100] [--acks N] [--durability strict|relaxed]
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { setMaxListeners } from "node:events";
import { parseArgs } from "node:util";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import pg from "pg";
import { pino } from "pino";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { buildApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import type { Clock } from "../control-plane/src/domain/clock.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { MAX_ACKNOWLEDGEMENTS } from "../control-plane/src/api/emission-service.js";
import { createProgressRepository } from "../control-plane/src/ledger/progress.repository.js";
import { sql as sqlText } from "../control-plane/src/ledger/sql.js";
import { createProgressSupervisors, type RunProgress } from "../control-plane/src/progress/progress-supervisor.js";
import {
  benchDurability,
  DURABILITY_OPTION,
  durabilityLabel,
  integerOption,
  ms,
  nodeCpuMs,
  postgresCpuMs,
  processCpuMs,
  summarize,
  table,
  type Durability,
  withBenchPostgres,
  verdict,
} from "./support.js";
import { startProfile } from "./sandbox/cpu-meter.js";
import type { ConnectorReport, ConnectorStart } from "./progress/connector-child.js";

const AGENT: AgentSpec = { ...DEMO_AGENT, id: "progress-bench", maxConcurrentRootRuns: 100_000 };
const CONNECTOR = "progress-bench";
const RAW_CONNECTIONS = 16;
const TIMEOUT_MS = 300_000;
/** Timed cadence ticks, each followed by a raw round. */
const ROUNDS = 3;

class BenchClock implements Clock {
  private at = Date.parse("2026-12-01T09:00:00Z");
  now(): Date {
    return new Date(this.at);
  }
  advance(by: number): void {
    this.at += by;
  }
}

const sleep = (delay: number) => new Promise((resolve) => setTimeout(resolve, delay));

async function until(what: string, probe: () => Promise<boolean>, pollMs = 20): Promise<void> {
  const deadline = Date.now() + TIMEOUT_MS;
  while (!(await probe())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(pollMs);
  }
}

export default async function progressBench(args: readonly string[]): Promise<void> {
  const { values } = parseArgs({
    args: [...args],
    options: { runs: { type: "string", default: "1000" }, "tick-ms": { type: "string", default: "50" }, probes: { type: "string", default: "200" }, acks: { type: "string" }, "ack-batch": { type: "string", default: "100" }, ...DURABILITY_OPTION },
  });
  const runs = integerOption("runs", values.runs, 1);
  const tickMs = integerOption("tick-ms", values["tick-ms"], 5);
  const probes = integerOption("probes", values.probes, 1);
  const ackBatch = integerOption("ack-batch", values["ack-batch"], 1, MAX_ACKNOWLEDGEMENTS);
  // One emission per call needs many calls in flight to keep up; batches fill while a few are out.
  const ackWindow = integerOption("acks", values.acks ?? (ackBatch === 1 ? "32" : "4"), 1);
  const durability = benchDurability(values.durability);
  const progress = (line: string) => process.stderr.write(`[progress] ${line}\n`);

  await withBenchPostgres("progress", progress, async (postgres) => {
    const env = { DATABASE_URL: postgres.url, KEEL_LOG_LEVEL: "warn", KEEL_WORKERS: "0", KEEL_DB_POOL_MAX: "20", KEEL_DURABILITY: durability };
    const clock = new BenchClock();
    const log = pino({ level: "warn" }, pino.destination(2));
    const app = await buildApp(loadConfig(env), env, { log, clock });
    const supervised: RunProgress[] = [];
    const stop = new AbortController();
    let connector: ConnectorProcess | undefined;
    setMaxListeners(0, stop.signal); // one listener per supervised run
    try {
      // The install's ceiling as high as it goes: 1,000 runs are claimed at once.
      await app.installSettings.update({ rootRunCeiling: 100_000 }, "progress bench");
      await app.agents.put(AGENT);
      const { secret: token } = await app.tokens.create("connector", "bench", { scope: { kind: "connector", connectors: "any", agents: "any" } });
      const { url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
      const db = app.ledger.sql;

      // N claimed root runs, triaged default, each in its own conversation.
      const runIds = Array.from({ length: runs }, () => randomUUID());
      await db.query(sqlText`INSERT INTO actors (id) VALUES ('bench-user') ON CONFLICT DO NOTHING`);
      await db.query(sqlText`
        WITH ids AS (SELECT id, ordinality AS i FROM unnest(${runIds}::uuid[]) WITH ORDINALITY AS t(id)),
        conversations AS (
          INSERT INTO conversations (id, agent_id, external_id, connector)
          SELECT id, ${AGENT.id}, 'c-' || i, ${CONNECTOR} FROM ids RETURNING id)
        INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, logical_request_id,
          request_received_at, trigger_count, event_seq, lease_owner, lease_epoch, lease_expires_at, started_at, triage_duration)
        SELECT id, ${AGENT.id}, id, ${CONNECTOR}, 'running', 'bench-user', ${JSON.stringify(AGENT.budget)}::jsonb, '{}'::jsonb, id,
          now(), 1, 1, 'bench-worker', 1, now() + interval '1 day', now(), 'default'
        FROM conversations`);
      progress(`${runs} running runs seeded; starting ${runs} supervisors (tick ${tickMs} ms, facts only: no summarizer)`);

      const supervisors = createProgressSupervisors({ ledger: createProgressRepository(db), clock, log, options: { tickMs } });
      const startedAt = clock.now();
      for (const runId of runIds) {
        supervised.push(
          supervisors.supervise({
            runId,
            epoch: 1,
            workerId: "bench-worker",
            startedAt,
            replyToMessageId: undefined,
            addressedActorIds: ["bench-user"],
            agent: AGENT,
            requestText: "a long one",
            cadence: undefined,
            signal: stop.signal,
          }),
        );
      }
      const reserved = async () => Number((await db.query<{ n: string }>(sqlText`SELECT count(*) AS n FROM progress_events`))[0]?.n ?? 0);
      await sleep(1_000); // every supervisor has had its first look: nothing is due yet

      // 1. The first cadence tick, no stream open.
      let cpu = { node: nodeCpuMs(), pg: postgresCpuMs(postgres.dataDir) };
      let started = performance.now();
      clock.advance(60_000);
      await until("every first notice", async () => (await reserved()) >= runs);
      const tick = { wallMs: performance.now() - started, nodeMs: (nodeCpuMs() - cpu.node) / runs, pgMs: (postgresCpuMs(postgres.dataDir) - cpu.pg) / runs };
      progress(`tick 1: ${runs} notices reserved in ${ms(tick.wallMs)} ms`);

      // 2. Idle looks (nothing due), then ingress while supervising.
      cpu = { node: nodeCpuMs(), pg: postgresCpuMs(postgres.dataDir) };
      started = performance.now();
      await sleep(2_000);
      const idleWallMs = performance.now() - started;
      const idleNodeMs = nodeCpuMs() - cpu.node;
      const bearer: Interceptor = (next) => (request) => {
        request.header.set("authorization", `Bearer ${token}`);
        return next(request);
      };
      const transport = createGrpcTransport({ baseUrl: url, interceptors: [bearer] });
      const ingress = createClient(IngressService, transport);
      const latencies: number[] = [];
      for (let i = 0; i < probes; i++) {
        const sent = performance.now();
        await ingress.submitMessage({ agentId: AGENT.id, conversationId: `probe-${i}`, actor: { id: "prober" }, messageId: randomUUID(), text: "probe", connector: "probe" });
        latencies.push(performance.now() - sent);
      }
      const ingressStats = summarize(latencies);
      const looks = runs * Math.max(1, idleWallMs / tickMs);
      progress(`idle looks measured; ${probes} SubmitMessage calls timed`);

      // 3 and 4. A connector, in its own process: Subscribe from 0, acknowledge each PENDING emission.
      connector = new ConnectorProcess();
      await connector.start({ kind: "start", url, token, connector: CONNECTOR, runs, ackWindow, ackBatch });
      started = performance.now();
      const allReceivedAt = connector.reached("received", runs).then(() => performance.now());
      await connector.reached("acknowledged", runs);
      const drainPerS = runs / ((performance.now() - started) / 1_000);
      const receivedPerS = runs / (((await allReceivedAt) - started) / 1_000);
      progress(`drain: ${runs} notices received at ${receivedPerS.toFixed(0)}/s, delivered+acknowledged at ${drainPerS.toFixed(0)}/s`);

      // Cadence ticks (3 min each) alternate with raw rounds, so drift on this machine (the disk's
      // fsync latency above all) falls on both sides; each round's ratio is to the raw round after it.
      const rounds: { keelPerS: number; rawPerS: number; nodeMs: number; pgMs: number; connectorMs: number }[] = [];
      for (let round = 1; round <= ROUNDS; round++) {
        const cpu = { node: nodeCpuMs(), pg: postgresCpuMs(postgres.dataDir), connector: connector.cpuMs() };
        const profile = round === 1 ? await startProfile("progress-tick") : undefined;
        started = performance.now();
        clock.advance(180_000);
        await connector.reached("acknowledged", (round + 1) * runs);
        const keelMs = performance.now() - started;
        await profile?.stop(progress);
        const used = { nodeMs: (nodeCpuMs() - cpu.node) / runs, pgMs: (postgresCpuMs(postgres.dataDir) - cpu.pg) / runs, connectorMs: (connector.cpuMs() - cpu.connector) / runs };
        const rawMs = await rawPhase(postgres.url, runIds, round, durability);
        rounds.push({ keelPerS: runs / (keelMs / 1_000), rawPerS: runs / (rawMs / 1_000), ...used });
        const last = rounds[rounds.length - 1]!;
        progress(`round ${round}: ${runs} notices reserved, delivered and acknowledged at ${last.keelPerS.toFixed(0)}/s; raw ${last.rawPerS.toFixed(0)}/s`);
      }
      await connector.stop();
      const median = (values: readonly number[]): number => [...values].sort((x, y) => x - y)[Math.floor(values.length / 2)]!;
      const emissionsPerS = median(rounds.map((r) => r.keelPerS));
      const rawPerS = median(rounds.map((r) => r.rawPerS));
      const ratio = median(rounds.map((r) => r.keelPerS / r.rawPerS));
      const perNotice = (pick: (r: (typeof rounds)[number]) => number) => ms(median(rounds.map(pick)));
      const lines = [
        "",
        `progress: ${runs} supervised runs on a manual clock, tick ${tickMs} ms, notices from the ledger's facts (no model); one Subscribe stream from a connector in its own process, acknowledging ${ackBatch === 1 ? `with one AcknowledgeEmission call per notice, ${ackWindow} in flight` : `in AcknowledgeEmissions calls of what arrived meanwhile (at most ${ackBatch} each, ${ackWindow} in flight)`}; ` +
          `raw = one transaction per notice (progress_events + emissions insert, NOTIFY) on ${RAW_CONNECTIONS} connections, a LISTEN client updating each to delivered; ` +
          `${durabilityLabel(durability)}`,
        "",
        ...table(
          ["metric", "value"],
          [
            ["tick 1 (60 s): notices reserved, wall ms", ms(tick.wallMs)],
            ["  keel CPU ms per run per cadence tick", ms(tick.nodeMs)],
            ["  of which idle looks while it waited (estimate)", ms((idleNodeMs / looks) * (tick.wallMs / tickMs))],
            ["  postgres CPU ms per run per cadence tick", ms(tick.pgMs)],
            ["idle look: keel CPU µs per run per look", ((idleNodeMs * 1_000) / looks).toFixed(2)],
            [`ingress while supervising: SubmitMessage p50/p99 ms (n=${ingressStats.n})`, `${ms(ingressStats.p50)} / ${ms(ingressStats.p99)}`],
            ["drain: notices received by the stream per s", receivedPerS.toFixed(0)],
            ["drain: notices delivered+acknowledged per s", drainPerS.toFixed(0)],
            ...rounds.map((r, i) => [`round ${i + 1}: keel / raw per s, ratio`, `${r.keelPerS.toFixed(0)} / ${r.rawPerS.toFixed(0)}, ${(r.keelPerS / r.rawPerS).toFixed(2)}`]),
            [`ticks (3 min): reserved+delivered+acknowledged per s, median of ${ROUNDS}`, emissionsPerS.toFixed(0)],
            ["  CPU ms per notice: keel / postgres / connector process", `${perNotice((r) => r.nodeMs)} / ${perNotice((r) => r.pgMs)} / ${perNotice((r) => r.connectorMs)}`],
            [`raw insert+NOTIFY+update per s, median of ${ROUNDS}`, rawPerS.toFixed(0)],
            ["emission ratio, median of the rounds' ratios", ratio.toFixed(2)],
          ],
        ),
        "",
        `targets: emission_ratio >= 0.5 (${verdict(ratio >= 0.5)}), supervisor CPU <= 1 ms per run per tick (${verdict(tick.nodeMs <= 1)}), ingress p99 <= 25 ms (${verdict(ingressStats.p99 <= 25)})`,
        `RESULT emissions_per_s=${emissionsPerS.toFixed(0)} raw_per_s=${rawPerS.toFixed(0)} emission_ratio=${ratio.toFixed(2)} supervisor_cpu_ms_per_tick=${tick.nodeMs.toFixed(3)}`,
      ];
      process.stdout.write(`${lines.join("\n")}\n`);
    } finally {
      connector?.kill();
      stop.abort();
      await Promise.all(supervised.map((s) => s.stop()));
      await app.stop();
    }
  });
}

/** The connector's process (bench/progress/connector-child.ts), driven over IPC. */
class ConnectorProcess {
  private readonly child: ChildProcess;
  private readonly counts = { received: 0, acknowledged: 0 };
  private readonly waiters = new Set<() => void>();
  private readonly stopped: Promise<ConnectorReport & { kind: "stopped" }>;
  private readonly ready: Promise<void>;

  constructor() {
    this.child = fork(path.join(path.dirname(fileURLToPath(import.meta.url)), "progress", "connector-child.ts"), [], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    let loaded: () => void = () => {};
    this.ready = new Promise((resolve) => (loaded = resolve));
    this.stopped = new Promise((resolve) => {
      this.child.on("message", (report: ConnectorReport) => {
        if (report.kind === "ready") loaded();
        else if (report.kind === "stopped") resolve(report);
        else this.counts[report.kind] = Math.max(this.counts[report.kind], report.count);
        for (const wake of this.waiters) wake();
      });
      this.child.on("exit", (code) => resolve({ kind: "stopped", error: `the connector process exited (${code})`, cpuUs: 0 }));
    });
  }

  /** Waits for the process to load (so its start-up is not timed), then starts it. */
  async start(request: ConnectorStart): Promise<void> {
    const early = await Promise.race([this.ready.then(() => undefined), this.stopped]);
    if (early !== undefined) throw new Error(`the connector stopped before it was ready: ${early.error ?? "no error"}`);
    this.child.send(request);
  }

  /** Settles once the connector has counted `count` notices of this kind; rejects if it stopped first or the bench times out. */
  async reached(kind: "received" | "acknowledged", count: number): Promise<void> {
    const deadline = Date.now() + TIMEOUT_MS;
    while (this.counts[kind] < count) {
      const early = await Promise.race([this.stopped.then((report) => report), new Promise<undefined>((resolve) => {
        const wake = () => {
          this.waiters.delete(wake);
          resolve(undefined);
        };
        this.waiters.add(wake);
        setTimeout(wake, 1_000).unref();
      })]);
      if (early !== undefined) throw new Error(`the connector stopped before ${count} ${kind}: ${early.error ?? "no error"}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${count} notices ${kind}`);
    }
  }

  cpuMs(): number {
    return this.child.pid === undefined ? 0 : processCpuMs(this.child.pid);
  }

  /** For a bench that failed: the process goes without a word. */
  kill(): void {
    if (this.child.exitCode === null) this.child.kill("SIGKILL");
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null) return;
    this.child.send({ kind: "stop" });
    const report = await this.stopped;
    if (report.error !== undefined) throw new Error(`the connector failed: ${report.error}`);
  }
}

/** The same rows by hand: insert + NOTIFY per notice on 16 connections, a listener marking each delivered. Returns wall ms. */
async function rawPhase(url: string, runIds: readonly string[], round: number, durability: Durability): Promise<number> {
  // Relaxed: every raw commit (the inserts and the updates) is asynchronous, as Keel's are.
  const options = durability === "relaxed" ? { options: "-c synchronous_commit=off" } : {};
  const pool = new pg.Pool({ connectionString: url, max: RAW_CONNECTIONS, ...options });
  const listener = new pg.Client({ connectionString: url });
  await listener.connect();
  try {
    await listener.query("LISTEN bench_raw");
    let updated = 0;
    let resolveDone: () => void = () => {};
    const done = new Promise<void>((resolve) => (resolveDone = resolve));
    const updates: Promise<unknown>[] = [];
    listener.on("notification", (message) => {
      updates.push(
        pool.query("UPDATE emissions SET delivery_status = 'delivered', settled_at = now() WHERE id = $1::uuid", [message.payload]).then(() => {
          if (++updated === runIds.length) resolveDone();
        }),
      );
    });
    const started = performance.now();
    let next = 0;
    const lane = async (): Promise<void> => {
      const client = await pool.connect();
      try {
        while (next < runIds.length) {
          const runId = runIds[next++] as string;
          const emissionId = randomUUID();
          await client.query("BEGIN");
          await client.query(
            `INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id, external_conversation_id, text, addressed_actor_ids)
             VALUES ($1, $2, 'progress-raw', 'progress', $3, $4, $3, 'raw', 'Still on it.', '["bench-user"]'::jsonb)`,
            [emissionId, `raw${round}:${runId}`, runId, AGENT.id],
          );
          await client.query(
            // Each seeded run has a conversation of its own, with the run's id (as the emission above says).
            "INSERT INTO progress_events (id, run_id, conversation_id, subject, seq, text, source, covers, emission_id) VALUES ($1, $2, $2, $3, 1, 'Still on it.', 'deadline', '[]', $4)",
            [randomUUID(), runId, `raw${round}:${runId}`, emissionId],
          );
          await client.query("SELECT pg_notify('bench_raw', $1)", [emissionId]);
          await client.query("COMMIT");
        }
      } finally {
        client.release();
      }
    };
    await Promise.all(Array.from({ length: RAW_CONNECTIONS }, () => lane()));
    await done;
    const elapsed = performance.now() - started;
    await Promise.all(updates);
    return elapsed;
  } finally {
    await listener.end();
    await pool.end();
  }
}
