// Loop benchmark: harness overhead per iteration of the durable loop (claim, history,
// model turn, intent commit, dispatch, result commit) with a scripted model and one read
// tool that take no time of their own, so what is left is Keel. Measured for 1 run alone
// and for 16 concurrent runs, beside a raw PostgreSQL transaction writing the same rows
// one iteration writes, timed on the same database in the same run.
//
// Sizes: 200 iterations per run, so the 16-run phase is 3,200 steps (a few seconds: its start,
// 16 runs claimed at once, is a small part of it), and as many raw transactions each way. With
// 40 iterations (640 steps, under a second) the throughput ratio moved by a fifth between runs.
//
//   npm run bench -- loop [--iterations 200] [--concurrent 16] [--raw 3200] [--durability strict|relaxed]
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import pg from "pg";
import { pino } from "pino";
import { z } from "zod";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedTurn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { loadConfig } from "../control-plane/src/config.js";
import { allowHeapGrowthForStreaming } from "../control-plane/src/heap-growth.js";
import { withBudgetDefaults, type AgentSpec } from "../control-plane/src/domain/agent.js";

import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { ZERO_USAGE } from "../control-plane/src/domain/run.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import {
  beginRaw,
  benchDurability,
  DURABILITY_OPTION,
  durabilityLabel,
  durabilitySettings,
  integerOption,
  ms,
  nodeCpuMs,
  pick,
  postgresCpuMs,
  summarize,
  table,
  withBenchPostgres,
  type Durability,
  verdict,
} from "./support.js";

/** The loop's targets, as multiples of the raw transaction timed in the same run. */
const OVERHEAD_TARGET = 4;
const THROUGHPUT_TARGET = 0.5;

interface Options {
  readonly iterations: number;
  readonly concurrent: number;
  readonly raw: number;
  readonly durability: Durability;
}

export const readTool = defineTool<{ key: string }>({
  name: "bench.read",
  version: 1,
  description: "Returns a short fixed observation (a read that costs nothing).",
  parameters: z.object({ key: z.string() }),
  effect: "read",
  execute(args) {
    return Promise.resolve({ ok: true, text: `value of ${args.key}: 42` });
  },
});

export function benchAgent(iterations: number): AgentSpec {
  const usage = { inputTokens: 100, outputTokens: 10 };
  const call = scriptedTurn("", [toolCall("bench.read.v1", { key: "k" })], usage);
  const done = scriptedTurn("done", [], usage);
  const room = iterations + 10;
  return scriptedAgent("loop-bench", [...Array.from({ length: iterations - 1 }, () => call), done], {
    budget: withBudgetDefaults({ maxIterations: room, maxModelCalls: room, maxToolCalls: room, maxInputTokens: room * 1000, maxOutputTokens: room * 1000 }),
    tools: toolGrants(["bench.read.v1"]),
  });
}

export default async function loopBench(args: readonly string[]): Promise<void> {
  const { values } = parseArgs({
    args: [...args],
    options: { iterations: { type: "string", default: "200" }, concurrent: { type: "string", default: "16" }, raw: { type: "string", default: "3200" }, ...DURABILITY_OPTION },
  });
  const options: Options = {
    // Two at the least: an iteration is timed as the gap between two step commits of a run.
    iterations: integerOption("iterations", values.iterations, 2),
    concurrent: integerOption("concurrent", values.concurrent, 1),
    raw: integerOption("raw", values.raw, 1),
    durability: benchDurability(values.durability),
  };
  const progress = (line: string) => process.stderr.write(`[loop] ${line}\n`);
  // This process hosts the control plane, with the garbage-collector headroom `keel serve` gives it.
  allowHeapGrowthForStreaming();

  await withBenchPostgres("loop", progress, async (postgres) => {
    const dataDir = postgres.dataDir;
    let app: KeelApp | undefined;
    try {
      const env = {
        DATABASE_URL: postgres.url,
        KEEL_LOG_LEVEL: "warn",
        KEEL_WORKERS: String(options.concurrent),
        ...pick(process.env, ["KEEL_WORKERS", "KEEL_DB_POOL_MAX", "KEEL_READ_FLUSH_MS"]),
        KEEL_DURABILITY: options.durability,
      };
      // Each commitStep call marks the start of an iteration's commit; the gap between two
      // consecutive ones of a run is one whole iteration of harness work.
      const marks = new Map<string, number[]>();
      const config = loadConfig(env);
      app = await buildApp(config, env, {
        log: pino({ level: "warn" }, pino.destination(2)),
        tools: [readTool],
        wrapRunnerDeps: (deps: RunnerDeps): RunnerDeps => ({
          ...deps,
          store: {
            ...deps.store,
            commitStep: async (commit) => {
              if (commit.step !== undefined) {
                const list = marks.get(commit.runId) ?? [];
                list.push(performance.now());
                marks.set(commit.runId, list);
              }
              return deps.store.commitStep(commit);
            },
          },
        }),
      });
      await app.agents.put(benchAgent(options.iterations));
      app.startWorkers();
      const db = new pg.Client({ connectionString: postgres.url });
      db.on("error", (error) => progress(`benchmark connection: ${error.message}`));
      await db.connect();
      const settings = await durabilitySettings(db);

      // Each phase's submissions carry its name: a phase's size may equal another's (--concurrent 1 or 2).
      const runPhase = async (phase: string, runs: number) => {
        marks.clear();
        const cpuBefore = { node: nodeCpuMs(), postgres: postgresCpuMs(dataDir) };
        const began = performance.now();
        const ids: string[] = [];
        for (let i = 0; i < runs; i++) ids.push(await submit(db, `${phase}-${i}`));
        await waitForAll(db, ids);
        const wallMs = performance.now() - began;
        const cpu = { node: nodeCpuMs() - cpuBefore.node, postgres: postgresCpuMs(dataDir) - cpuBefore.postgres };
        const gaps = [...marks.values()].flatMap((list) => list.slice(1).map((t, i) => t - list[i]!));
        const steps = [...marks.values()].reduce((n, list) => n + list.length, 0);
        progress(`${runs} run(s): ${steps} steps in ${(wallMs / 1000).toFixed(2)} s`);
        return { gaps, steps, wallMs, cpu };
      };

      await runPhase("warm-up", 2);
      const single = await runPhase("single", 1);
      const concurrent = await runPhase("concurrent", options.concurrent);

      progress(`raw transactions: ${options.raw} serial, then ${options.raw} over ${options.concurrent} connections`);
      const rawSerial: number[] = [];
      const serialRun = await rawRun(db, "raw-serial");
      for (let i = 0; i < options.raw; i++) {
        const started = performance.now();
        await rawIteration(db, serialRun, options.durability);
        rawSerial.push(performance.now() - started);
      }
      const clients = await Promise.all(
        Array.from({ length: options.concurrent }, async () => {
          const client = new pg.Client({ connectionString: postgres.url });
          await client.connect();
          return { client, run: await rawRun(client, `raw-${randomUUID()}`) };
        }),
      );
      const rawCpuBefore = { node: nodeCpuMs(), postgres: postgresCpuMs(dataDir) };
      const rawBegan = performance.now();
      let next = 0;
      await Promise.all(clients.map(async ({ client, run }) => {
        while (next++ < options.raw) await rawIteration(client, run, options.durability);
      }));
      const rawPerSecond = options.raw / ((performance.now() - rawBegan) / 1000);
      const rawCpu = { node: nodeCpuMs() - rawCpuBefore.node, postgres: postgresCpuMs(dataDir) - rawCpuBefore.postgres };
      await Promise.all(clients.map(({ client }) => client.end()));
      await db.end();

      const one = summarize(single.gaps);
      const many = summarize(concurrent.gaps);
      const raw = summarize(rawSerial);
      const stepsPerSecond = concurrent.steps / (concurrent.wallMs / 1000);
      const overheadRatio = one.p50 / raw.p50;
      const throughputRatio = stepsPerSecond / rawPerSecond;
      const lines = [
        "",
        `loop: ${options.iterations} iterations per run (scripted model, one read tool, both instant); 1 run, then ${options.concurrent} concurrent; ` +
          `${config.workers} workers; embedded PostgreSQL 17 (${settings}); ${durabilityLabel(options.durability)}`,
        "",
        ...table(
          ["metric", "p50_ms", "p99_ms", "n"],
          [
            ["iteration overhead, 1 run", ms(one.p50), ms(one.p99), String(one.n)],
            [`iteration overhead, ${options.concurrent} runs`, ms(many.p50), ms(many.p99), String(many.n)],
            ["raw txn, same rows", ms(raw.p50), ms(raw.p99), String(raw.n)],
          ],
        ),
        "",
        ...table(
          ["throughput", "per_s", "node_cpu_ms_each", "postgres_cpu_ms_each"],
          [
            [`keel steps, ${options.concurrent} runs`, stepsPerSecond.toFixed(1), ms(concurrent.cpu.node / concurrent.steps), ms(concurrent.cpu.postgres / concurrent.steps)],
            [`raw txns, ${options.concurrent} connections`, rawPerSecond.toFixed(1), ms(rawCpu.node / options.raw), ms(rawCpu.postgres / options.raw)],
          ],
        ),
        "",
        `targets: overhead p50 <= ${OVERHEAD_TARGET}x raw (is ${overheadRatio.toFixed(2)}x) ${verdict(overheadRatio <= OVERHEAD_TARGET)}; ` +
          `throughput >= ${THROUGHPUT_TARGET}x raw (is ${throughputRatio.toFixed(2)}x) ${verdict(throughputRatio >= THROUGHPUT_TARGET)}`,
        `RESULT mode=${options.durability} overhead_p50_ms=${ms(one.p50)} raw_txn_p50_ms=${ms(raw.p50)} overhead_ratio=${overheadRatio.toFixed(2)} ` +
          `steps_per_s=${stepsPerSecond.toFixed(1)} raw_txn_per_s=${rawPerSecond.toFixed(1)} throughput_ratio=${throughputRatio.toFixed(2)}`,
      ];
      process.stdout.write(`${lines.join("\n")}\n`);
    } finally {
      await app?.stop();
    }
  });
}

/** A run's rows in one statement, prepared once per connection as Keel's own admission statements are. */
const SUBMIT = `WITH actor AS (INSERT INTO actors (id) VALUES ('bench') ON CONFLICT DO NOTHING),
     conversation AS (INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, 'loop-bench', $3, 'bench')),
     message AS (INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($2, $1, $3, 'bench', 'go', $4)),
     run AS (
       INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage, not_before)
       VALUES ($4, 'loop-bench', $1, 'bench', $6, 'bench', $3, $5::jsonb, '{}'::jsonb, $7::timestamptz)),
     run_trigger AS (INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) VALUES ($4, $2, 'bench', $3))
     SELECT 1`;
/** A wake-up that commits without waiting for its WAL flush (what it announces is already durable). */
const SUBMIT_WAKE = "SELECT pg_notify('keel_runs', $1::text) FROM (SELECT set_config('synchronous_commit', 'off', true)) AS durability";

export async function submit(db: pg.ClientBase, key: string, status: "queued" | "running" = "queued", runId: string = randomUUID()): Promise<string> {
  // Submitting through SQL keeps the gRPC path out of this benchmark; first-slice covers it. The
  // rows go in one statement, as the peers' submissions are one (a DBOS workflow row, a Restate
  // call). The wake-up follows the commit, as Keel's admission sends it (ledger/sql.ts, notify): a
  // transaction that notifies holds PostgreSQL's one notification lock through its WAL flush, so
  // submissions that notified inside it committed one at a time (16 took up to 50 ms).
  // Due now on Keel's clock (this process's), as admission sets it: the database's now() would be
  // microseconds later than what a claim in the same millisecond compares it with.
  await db.query({ name: "bench_submit", text: SUBMIT, values: [randomUUID(), randomUUID(), key, runId, JSON.stringify(DEMO_AGENT.budget), status, new Date()] });
  if (status === "queued") await db.query({ name: "bench_submit_wake", text: SUBMIT_WAKE, values: [runId] });
  return runId;
}

export async function waitForAll(db: pg.ClientBase, ids: readonly string[]): Promise<void> {
  const deadline = Date.now() + 600_000;
  for (;;) {
    const { rows } = await db.query<{ open: string; failed: string }>(
      `SELECT count(*) FILTER (WHERE status NOT IN ('succeeded','failed','cancelled','budget_exhausted')) AS open,
              count(*) FILTER (WHERE status <> 'succeeded' AND status IN ('failed','cancelled','budget_exhausted')) AS failed
       FROM runs WHERE id = ANY($1::uuid[])`,
      [ids],
    );
    if (Number(rows[0]?.failed) > 0) throw new Error(`${rows[0]?.failed} benchmark run(s) did not succeed`);
    if (Number(rows[0]?.open) === 0) return;
    if (Date.now() > deadline) throw new Error("benchmark runs did not finish in 10 minutes");
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Like a stored request after the first: the previous call's messages kept, the new turn and result appended. */
const RAW_REQUEST = JSON.stringify({
  base: randomUUID(),
  keep: 2,
  messages: [
    { role: "assistant", content: "", toolCalls: [{ id: "call_1", name: "bench.read.v1", argumentsJson: '{"key":"k"}' }] },
    { role: "tool", toolCallId: "call_1", content: "value of k: 42" },
  ],
});

/** A run row of its own for a raw connection, held as a running run would be (no lease a worker could take over). */
async function rawRun(db: pg.Client, key: string): Promise<RawRun> {
  const runId = await submit(db, key, "running");
  return { runId, iteration: 0, eventSeq: 0 };
}

interface RawRun {
  readonly runId: string;
  iteration: number;
  eventSeq: number;
}

/**
 * The rows one iteration of the loop writes, in one transaction: the run row (status, usage,
 * step count, event sequence), the step with its model call, and the tool call (intent and result).
 * The iteration's two events (tool settled, step committed) are numbered on the call and step
 * rows, as Keel records them (run_event_feed), and the result is the call's, not an observation.
 */
async function rawIteration(db: pg.Client, run: RawRun, durability: Durability): Promise<void> {
  const stepId = randomUUID();
  const invocationId = randomUUID();
  const index = run.iteration++;
  const firstSeq = run.eventSeq + 1;
  run.eventSeq += 2;
  await beginRaw(db, durability);
  try {
    await db.query(
      `UPDATE runs SET status = $2, usage = $3::jsonb, step_count = step_count + 1, event_seq = $4, updated_at = now() WHERE id = $1`,
      [run.runId, "running", JSON.stringify({ ...ZERO_USAGE, iterations: index + 1, modelCalls: index + 1 }), run.eventSeq],
    );
    await db.query(
      `INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, actor_id, lease_epoch, started_at, event_seq, event_summary,
         call_id, call_role, call_provider, call_model, call_request, call_response_text, call_tool_calls, call_input_tokens,
         call_output_tokens, call_latency_ms, call_finish_reason, call_cost_micro_usd)
       VALUES ($1, $2, $3, 'replayable', 'running', 'bench', 1, now(), $4, 'step 1: 1 tool call(s) to dispatch (bench.read.v1)',
         $5, 'primary', 'scripted', 'scripted', $6::jsonb, '', '[{"id":"c","name":"bench.read.v1"}]'::jsonb, 100, 10, 0, 'tool_calls', 0)`,
      [stepId, run.runId, index, firstSeq + 1, randomUUID(), RAW_REQUEST],
    );
    await db.query(
      `INSERT INTO tool_invocations (id, run_id, step_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status,
         result_text, finished_at, settled_seq)
       VALUES ($1, $2, $3, 'c', 0, 'bench.read.v1', 'v1', 'read', '{"key":"k"}'::jsonb, 'succeeded', 'value of k: 42', now(), $4)`,
      [invocationId, run.runId, stepId, firstSeq],
    );
    await db.query("COMMIT");
  } catch (error) {
    await db.query("ROLLBACK").catch(() => {});
    throw error;
  }
}
