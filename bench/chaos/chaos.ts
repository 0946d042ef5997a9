// `npm run chaos -- --minutes N`: several control-plane replicas and sandbox agents on one
// PostgreSQL run a workload of root runs (sandbox execs, reads, and a write to an external
// effect log) through a calm phase, then N minutes of faults (SIGKILL a replica, SIGSTOP one
// past its lease, SIGKILL a sandbox agent, restart PostgreSQL immediately). Then it checks that
// nothing was lost, duplicated or left stuck, prints a table and a RESULT line, and exits
// non-zero when an invariant fails. Options: see USAGE.
import { randomInt } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import { scriptedAgent, scriptedTurn, toolCall, toolGrants } from "../../control-plane/src/fixtures/scripted-model.js";
import { createApiTokenRepository } from "../../control-plane/src/ledger/api-token.repository.js";
import { createSqlPool } from "../../control-plane/src/ledger/sql.js";
import { killAllChildren, prepareLedger } from "../../test/support/child-processes.js";
import { killAllChildren as killAgents } from "../../test/support/sandbox-support.js";
import { startEffectLog } from "./effect-log.js";
import { EFFECT_TOOL } from "./effect-tool.js";
import { FAULT_KINDS, seededRandom, startFaults, type FaultRecord } from "./faults.js";
import { checkInvariants, type InvariantReport } from "./invariants.js";
import { startChaosPostgres } from "./postgres.js";
import { printReport } from "./report.js";
import { startTopology } from "./topology.js";
import { CONNECTOR, startWorkload } from "./workload.js";

const USAGE = `usage: npm run chaos -- [--minutes N] [--calm-seconds S] [--concurrency C] [--replicas R] [--agents A]
                        [--min-gap-seconds G] [--max-gap-seconds G] [--seed N] [--lease-ms MS]`;

const AGENT_ID = "chaos";
const MODEL_DELAY_MS = 100;
/**
 * The workload's execs are bounded well below the default: an exec relayed to a replica that
 * dies mid-command is settled only when its timeout (plus the dispatcher's 30 s slack) runs out,
 * and the drain waits that long before it calls a run stuck.
 */
const EXEC_TIMEOUT_MS = 10_000;
const EXEC_SETTLE_MS = EXEC_TIMEOUT_MS + 30_000;

/** One job: an exec that writes in the workspace, two reads of it, the external write, the reply. */
function chaosAgent() {
  const turn = (calls: Parameters<typeof scriptedTurn>[1], reply = "") => scriptedTurn(reply, calls, { delayMs: MODEL_DELAY_MS, inputTokens: 10, outputTokens: 10 });
  return scriptedAgent(
    AGENT_ID,
    [
      turn([toolCall("sandbox.exec.v1", { command: "echo chaos > note.txt && sleep 0.2 && ls", timeout_ms: EXEC_TIMEOUT_MS })]),
      turn([toolCall("sandbox.read_file.v1", { path: "note.txt" }), toolCall("sandbox.exec.v1", { command: "cat note.txt", timeout_ms: EXEC_TIMEOUT_MS })]),
      turn([toolCall(`${EFFECT_TOOL}.v1`, { note: "chaos" })]),
      turn([], "done: {{message}}"),
    ],
    { displayName: "chaos workload", tools: toolGrants(["sandbox.exec.v1", "sandbox.read_file.v1", `${EFFECT_TOOL}.v1`], ["cat"]) },
  );
}

interface Options {
  readonly minutes: number;
  readonly calmSeconds: number;
  readonly concurrency: number;
  readonly replicas: number;
  readonly agents: number;
  readonly minGapMs: number;
  readonly maxGapMs: number;
  readonly seed: number;
  readonly leaseMs: number;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      minutes: { type: "string", default: "10" },
      "calm-seconds": { type: "string" },
      concurrency: { type: "string", default: "4" },
      replicas: { type: "string", default: "3" },
      agents: { type: "string", default: "2" },
      "min-gap-seconds": { type: "string", default: "5" },
      "max-gap-seconds": { type: "string", default: "10" },
      seed: { type: "string" },
      "lease-ms": { type: "string", default: "3000" },
    },
  });
  const number = (name: string, value: string | undefined, min: number, max: number): number => {
    const n = Number(value);
    if (value === undefined || !Number.isFinite(n) || n < min || n > max) throw new Error(`--${name} must be a number from ${min} to ${max}, not ${JSON.stringify(value)}\n${USAGE}`);
    return n;
  };
  const minutes = number("minutes", values.minutes, 0.25, 600);
  const minGap = number("min-gap-seconds", values["min-gap-seconds"], 1, 600);
  return {
    minutes,
    // A calm phase long enough to measure, short beside the chaos.
    calmSeconds: number("calm-seconds", values["calm-seconds"] ?? String(Math.min(60, Math.max(20, minutes * 15))), 5, 3600),
    concurrency: Math.round(number("concurrency", values.concurrency, 1, 64)),
    replicas: Math.round(number("replicas", values.replicas, 1, 8)),
    agents: Math.round(number("agents", values.agents, 1, 8)),
    minGapMs: minGap * 1000,
    maxGapMs: number("max-gap-seconds", values["max-gap-seconds"], minGap, 600) * 1000,
    seed: Math.round(number("seed", values.seed ?? String(randomInt(1, 2 ** 31)), 0, 2 ** 32)),
    leaseMs: Math.round(number("lease-ms", values["lease-ms"], 500, 60_000)),
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const say = (line: string) => process.stdout.write(`${line}\n`);

async function maxEmissionSeq(url: string): Promise<bigint> {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    const { rows } = await db.query<{ seq: string | null }>("SELECT max(seq)::text AS seq FROM emissions WHERE connector = $1", [CONNECTOR]);
    return BigInt(rows[0]?.seq ?? "0");
  } finally {
    await db.end();
  }
}

/** Runs of the workload not yet terminal nor waiting on an unknown outcome. */
async function unsettledRuns(url: string): Promise<number> {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    const { rows } = await db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM runs WHERE agent_id = $1
          AND status NOT IN ('succeeded', 'failed', 'cancelled', 'budget_exhausted')
          AND NOT (status = 'waiting' AND wait_reason = 'unknown_write_outcome')`,
      [AGENT_ID],
    );
    return rows[0]?.n ?? 0;
  } finally {
    await db.end();
  }
}

async function main(args: readonly string[]): Promise<number> {
  const options = parseOptions(args);
  const started = Date.now();
  const clock = () => {
    const s = Math.round((Date.now() - started) / 1000);
    return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
  };
  say(`chaos: ${options.replicas} replicas, ${options.agents} sandbox agents (process backend, bubblewrap), one PostgreSQL; ` +
    `concurrency ${options.concurrency}, calm ${options.calmSeconds} s, chaos ${options.minutes} min, faults every ${options.minGapMs / 1000}-${options.maxGapMs / 1000} s, lease ${options.leaseMs} ms, seed ${options.seed}`);

  const workDir = await mkdtemp(path.join(tmpdir(), "keel-chaos-"));
  const postgres = await startChaosPostgres();
  const effectLog = await startEffectLog();
  // Interrupted (Ctrl-C, a CI timeout): leave no replica, agent or PostgreSQL behind.
  const interrupted = (signal: NodeJS.Signals) => {
    say(`chaos: ${signal}; stopping every process it started`);
    void Promise.all([killAgents(), killAllChildren()])
      .then(() => postgres.stop())
      .finally(() => process.exit(130));
  };
  process.once("SIGINT", interrupted);
  process.once("SIGTERM", interrupted);
  try {
    await prepareLedger(postgres.url, [chaosAgent()]);
    const sql = createSqlPool({ url: postgres.url, max: 2 });
    const tokens = createApiTokenRepository(sql);
    const connectorToken = (await tokens.create("connector", "chaos", { scope: { kind: "connector", connectors: [CONNECTOR], agents: "any" } })).secret;
    const hostToken = async (hostId: string) =>
      (await tokens.create("sandbox-host", hostId, { scope: { kind: "sandbox-host", hostId, maxCapacity: 2 * options.concurrency, labels: {} } })).secret;

    const env = {
      DATABASE_URL: postgres.url,
      KEEL_WORKERS: "2",
      KEEL_DB_POOL_MAX: "8",
      KEEL_LEASE_MS: String(options.leaseMs),
      KEEL_IDLE_POLL_MS: "500",
      KEEL_LOG_LEVEL: "warn",
      KEEL_SANDBOX_KEEP_MS: "0",
      KEEL_SANDBOX_SWEEP_MS: "1000",
      KEEL_SANDBOX_HEARTBEAT_MS: "1000",
      KEEL_SANDBOX_PLACEMENT_WAIT_MS: "8000",
      KEEL_SANDBOX_REATTACH_WAIT_MS: "8000",
      KEEL_CHAOS_EFFECT_URL: effectLog.url,
    };
    const topology = await startTopology({ replicas: options.replicas, agents: options.agents, env, workDir, hostToken, agentCapacity: 2 * options.concurrency });
    await sql.close();
    say(`[${clock()}] ${options.replicas} replicas serving, ${options.agents} agents attached; effect log at ${effectLog.url}`);

    const workload = startWorkload({ databaseUrl: postgres.url, agentId: AGENT_ID, token: connectorToken, concurrency: options.concurrency, liveUrls: () => topology.liveUrls() });
    let phase = "warm-up";
    let faults: ReturnType<typeof startFaults> | undefined;
    const progress = setInterval(() => {
      const byKind = faults === undefined ? "" : ` faults=${faults.records.length}`;
      say(`[${clock()}] ${phase}: submitted=${workload.stats.submitted} finished=${workload.runs.size - workload.inFlight()} in_flight=${workload.inFlight()} effects=${effectLog.records.length}${byKind} live_replicas=${topology.liveUrls().length}`);
    }, 10_000);

    let report: InvariantReport;
    let calm: { seconds: number; finished: number };
    let chaos: { seconds: number; finished: number };
    let faultRecords: readonly FaultRecord[] = [];
    let crashes: string[] = [];
    try {
      await sleep(10_000); // warm-up: the first runs pay for compilation and connections
      phase = "calm";
      const calmStart = Date.now();
      await sleep(options.calmSeconds * 1000);
      const calmEnd = Date.now();
      calm = { seconds: (calmEnd - calmStart) / 1000, finished: workload.finishedBetween(calmStart, calmEnd) };

      phase = "chaos";
      faults = startFaults({
        topology,
        postgres,
        rng: seededRandom(options.seed),
        minGapMs: options.minGapMs,
        maxGapMs: options.maxGapMs,
        stopMs: options.leaseMs + 2_000,
        log: (line) => say(`[${clock()}] ${line}`),
      });
      const chaosStart = Date.now();
      await sleep(options.minutes * 60_000);
      await faults.stop();
      const chaosEnd = Date.now();
      chaos = { seconds: (chaosEnd - chaosStart) / 1000, finished: workload.finishedBetween(chaosStart, chaosEnd) };
      faultRecords = faults.records;
      crashes = [...faults.unexpectedExits, ...(await topology.heal())];

      phase = "drain";
      await workload.stopSubmitting();
      // Runs left unleased past this long count as stuck: three leases, with room for a placement wait.
      const stuckAfterMs = 3 * options.leaseMs + 10_000;
      // Every run gets that long past the last one to settle (and at least an exec's bounded
      // wait), then the stream to catch up with what the ledger committed, before they are compared.
      let deadline = Date.now() + Math.max(2 * stuckAfterMs, EXEC_SETTLE_MS + 15_000);
      while ((await unsettledRuns(postgres.url)) > 0 && Date.now() < deadline) await sleep(500);
      const target = await maxEmissionSeq(postgres.url);
      deadline = Date.now() + 30_000;
      while (workload.lastSeq() < target && Date.now() < deadline) await sleep(250);
      report = await checkInvariants({
        databaseUrl: postgres.url,
        agentId: AGENT_ID,
        effectTool: EFFECT_TOOL,
        connector: CONNECTOR,
        effects: effectLog.records,
        workload,
        stuckAfterMs,
      });
    } finally {
      clearInterval(progress);
      await faults?.stop();
      await workload.close();
      await topology.stopAll();
    }

    const failed = printReport(say, {
      options,
      calm,
      chaos,
      faults: faultRecords,
      crashes,
      faultKinds: FAULT_KINDS,
      report,
      effectLog: { fenced: effectLog.fencedRequests(), lookups: effectLog.lookups() },
      workload: { ...workload.stats, reconnects: workload.subscriberReconnects(), emissionsReceived: workload.received.size },
    });
    return failed ? 1 : 0;
  } finally {
    await killAgents();
    await killAllChildren();
    await effectLog.close();
    await postgres.stop();
    await rm(workDir, { recursive: true, force: true });
  }
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (error) {
  process.stderr.write(`chaos: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exitCode = 2;
}
setTimeout(() => {
  process.stderr.write("chaos: something still held the event loop 5 s after the run finished; exiting\n");
  process.exit();
}, 5000).unref();
