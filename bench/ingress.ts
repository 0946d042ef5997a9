// Ingress benchmark: how long from a connector's SubmitMessage to the run's first model call,
// with a coalesce window of 0, through a real Keel (embedded PostgreSQL with normal durability,
// the HTTP/2 server on loopback, in-process workers, an instant scripted model). The clock
// starts before SubmitMessage is sent over gRPC and stops when the model provider is called.
// Measured with one conversation and with 50 concurrent ones; each conversation sends its
// next message a short think time after its previous run settles, so every message is a new
// request and admission, not follow-up classification, is what is timed. The baseline is one
// raw SQL transaction writing the rows that path writes (message, run, trigger, event, ack,
// and the claim), timed on the same database in the same run. Each phase also shows when
// SubmitMessage answered, the CPU Keel (this process: server, client, workers) and
// PostgreSQL used per message, and how many first calls started before admission read the
// conversation (KEEL_SPECULATIVE_START; a conversation's first message never does). RESULT
// takes each percentile from the worse of the two phases and the line above it says which
// phase that was; the targets line judges them.
//
//   npm run bench -- ingress [--messages 400] [--concurrent 50] [--think-ms 1000] [--warmup 30] [--raw 1000]
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import pg from "pg";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { WORKING_ACK } from "../control-plane/src/domain/settlement.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { isTerminal, ZERO_USAGE } from "../control-plane/src/domain/run.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import {
  integerOption,
  beginRaw,
  benchDurability,
  DURABILITY_OPTION,
  durabilityLabel,
  durabilitySettings,
  ms,
  nodeCpuMs,
  postgresCpuMs,
  startBenchKeel,
  summarize,
  table,
  type Durability,
  type Stats,
  withBenchPostgres,
  verdict,
} from "./support.js";

const AGENT: AgentSpec = {
  ...DEMO_AGENT,
  id: "ingress-bench",
  interrupt: { ...DEMO_AGENT.interrupt, coalesceWindowMs: 0 },
  maxConcurrentRootRuns: 1_000,
};
const TIMEOUT_MS = 60_000;

/** The conversations issue's targets for message→first model call (the worse phase). */
const P50_TARGET_MS = 5;
const P99_TARGET_MS = 25;
/**
 * The same targets as multiples of the raw transaction's p50 timed in the same run: they were
 * first met beside a raw p50 of 1.87 ms (f114f99), on a faster machine than some that run this.
 */
const FIRST_MET_RAW_P50_MS = 1.87;
const P50_RATIO_TARGET = P50_TARGET_MS / FIRST_MET_RAW_P50_MS;
const P99_RATIO_TARGET = P99_TARGET_MS / FIRST_MET_RAW_P50_MS;

interface Options {
  readonly messages: number;
  readonly concurrent: number;
  readonly thinkMs: number;
  readonly warmup: number;
  readonly raw: number;
  readonly durability: Durability;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      messages: { type: "string", default: "400" },
      concurrent: { type: "string", default: "50" },
      "think-ms": { type: "string", default: "1000" },
      warmup: { type: "string", default: "30" },
      raw: { type: "string", default: "1000" },
      ...DURABILITY_OPTION,
    },
  });
  return {
    messages: integerOption("messages", values.messages, 1),
    concurrent: integerOption("concurrent", values.concurrent, 1),
    thinkMs: integerOption("think-ms", values["think-ms"], 0),
    warmup: integerOption("warmup", values.warmup, 0),
    raw: integerOption("raw", values.raw, 1),
    durability: benchDurability(values.durability),
  };
}

/** Per message text: when the model was first called for it, and when its run settled. */
class Marks {
  private readonly modelCalled = new Map<string, number>();
  private readonly waiters = new Map<string, (at: number) => void>();
  private readonly settled = new Map<string, () => void>();
  private readonly settledEarly = new Set<string>();

  firstModelCall(text: string, at: number): void {
    if (this.modelCalled.has(text)) return;
    this.modelCalled.set(text, at);
    this.waiters.get(text)?.(at);
  }

  runSettled(runId: string): void {
    const done = this.settled.get(runId);
    if (done === undefined) this.settledEarly.add(runId);
    else done();
  }

  untilModelCall(text: string): Promise<number> {
    const seen = this.modelCalled.get(text);
    if (seen !== undefined) return Promise.resolve(seen);
    return withTimeout(new Promise((resolve) => this.waiters.set(text, resolve)), `no model call for ${JSON.stringify(text)}`);
  }

  untilSettled(runId: string): Promise<void> {
    if (this.settledEarly.delete(runId)) return Promise.resolve();
    return withTimeout(new Promise<void>((resolve) => this.settled.set(runId, resolve)), `run ${runId} did not settle`);
  }
}

/** One phase's figures: message→first model call, message→SubmitMessage answered, CPU per message. */
interface PhaseResult {
  readonly firstCall: Stats;
  readonly answered: Stats;
  readonly nodeCpuMs: number;
  readonly postgresCpuMs: number;
  /** First calls started before the conversation was read, and of those withdrawn. */
  readonly speculative: { readonly started: number; readonly withdrawn: number };
}

export default async function ingressBench(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const progress = (line: string) => process.stderr.write(`[ingress] ${line}\n`);

  await withBenchPostgres("ingress", progress, async (postgres) => {
    const marks = new Marks();
    const { app, config, url, token } = await startBenchKeel(postgres, AGENT, options.durability, {
      wrapRunnerDeps: (deps: RunnerDeps): RunnerDeps => ({
        ...deps,
        providers: {
          ...deps.providers,
          scripted: {
            ...deps.providers.scripted,
            complete: (request) => {
              const user = request.messages.findLast((m) => m.role === "user");
              if (user !== undefined) marks.firstModelCall(user.content, performance.now());
              return deps.providers.scripted.complete(request);
            },
          },
        },
        store: {
          ...deps.store,
          commitStep: async (commit) => {
            const control = await deps.store.commitStep(commit);
            if (isTerminal(commit.status)) marks.runSettled(commit.runId);
            return control;
          },
        },
      }),
    });
    try {
      const db = new pg.Client({ connectionString: postgres.url });
      await db.connect();
      let settings: string;
      let one: PhaseResult;
      let many: PhaseResult;
      let raw: number[];
      try {
        settings = await durabilitySettings(db);
        progress(`keel on ${url}: ${config.workers} workers, db pool ${config.dbPoolMax}; postgres ${settings}`);
        const send = sender(url, token, marks);
        const measured = async (label: string, conversations: number): Promise<PhaseResult> => {
          const before = { node: nodeCpuMs(), postgres: postgresCpuMs(postgres.dataDir), starts: app.speculativeStarts() };
          const samples = await phase(send, label, options.messages, conversations, options.thinkMs);
          const starts = app.speculativeStarts();
          return {
            speculative: { started: starts.started - before.starts.started, withdrawn: starts.withdrawn - before.starts.withdrawn },
            firstCall: summarize(samples.map((s) => s.firstCall)),
            answered: summarize(samples.map((s) => s.answered)),
            nodeCpuMs: (nodeCpuMs() - before.node) / samples.length,
            postgresCpuMs: (postgresCpuMs(postgres.dataDir) - before.postgres) / samples.length,
          };
        };
        await phase(send, "warmup", options.warmup, Math.min(options.concurrent, 10), options.thinkMs);
        one = await measured("one", 1);
        progress(`1 conversation: ${one.firstCall.n} messages`);
        many = await measured("many", options.concurrent);
        progress(`${options.concurrent} conversations: ${many.firstCall.n} messages`);
        raw = await rawPhase(db, options);
        progress(`raw: ${raw.length} transactions`);
      } finally {
        await db.end();
      }

      const rawStats = summarize(raw);
      const manyLabel = `${options.concurrent} conversations`;
      const row = (metric: string, stats: Stats, cpu?: PhaseResult): string[] => [
        metric,
        ms(stats.p50),
        ms(stats.p99),
        String(stats.n),
        cpu === undefined ? "" : ms(cpu.nodeCpuMs),
        cpu === undefined ? "" : ms(cpu.postgresCpuMs),
      ];
      const worse = (pick: (stats: Stats) => number): { value: number; from: string } =>
        pick(many.firstCall) > pick(one.firstCall) ? { value: pick(many.firstCall), from: manyLabel } : { value: pick(one.firstCall), from: "1 conversation" };
      const p50 = worse((s) => s.p50);
      const p99 = worse((s) => s.p99);
      const p50Ratio = p50.value / rawStats.p50;
      const p99Ratio = p99.value / rawStats.p50;
      const lines = [
        "",
        `ingress: message→first model call, coalesce window 0, scripted model, ${options.thinkMs} ms think time between a conversation's messages; ` +
          `${config.workers} workers; embedded PostgreSQL 17 (${settings}); ${durabilityLabel(options.durability)}; ${options.warmup} warm-up messages not counted; ` +
          "CPU columns are per message (keel = this whole process: gRPC client and server, workers)",
        "",
        ...table(
          ["metric", "p50_ms", "p99_ms", "n", "keel_cpu_ms", "pg_cpu_ms"],
          [
            row("message→first model call, 1 conversation", one.firstCall, one),
            row("  message→SubmitMessage answered", one.answered),
            row(`message→first model call, ${manyLabel}`, many.firstCall, many),
            row("  message→SubmitMessage answered", many.answered),
            row("raw txn, same rows (ingress + claim)", rawStats),
          ],
        ),
        "",
        `speculative starts (first call before admission read the conversation): 1 conversation ${one.speculative.started} of ${one.firstCall.n} ` +
          `(${one.speculative.withdrawn} withdrawn), ${manyLabel} ${many.speculative.started} of ${many.firstCall.n} (${many.speculative.withdrawn} withdrawn)`,
        `RESULT: each percentile is the worse of the two phases: p50 from ${p50.from}, p99 from ${p99.from} ` +
          `(1 conversation ${ms(one.firstCall.p50)}/${ms(one.firstCall.p99)} ms, ${manyLabel} ${ms(many.firstCall.p50)}/${ms(many.firstCall.p99)} ms p50/p99).`,
        `targets: p50 <= ${P50_TARGET_MS} ms (is ${ms(p50.value)}) ${verdict(p50.value <= P50_TARGET_MS)}, or <= ${P50_RATIO_TARGET.toFixed(2)}x the raw txn's p50 ` +
          `(is ${p50Ratio.toFixed(2)}x) ${verdict(p50Ratio <= P50_RATIO_TARGET)}; p99 <= ${P99_TARGET_MS} ms (is ${ms(p99.value)}) ${verdict(p99.value <= P99_TARGET_MS)}, ` +
          `or <= ${P99_RATIO_TARGET.toFixed(1)}x the raw txn's p50 (is ${p99Ratio.toFixed(1)}x) ${verdict(p99Ratio <= P99_RATIO_TARGET)} ` +
          `(the ratios are the targets as first met, beside a raw p50 of ${FIRST_MET_RAW_P50_MS} ms)`,
        `RESULT mode=${options.durability} p50_ms=${ms(p50.value)} p99_ms=${ms(p99.value)} raw_txn_p50_ms=${ms(rawStats.p50)} ` +
          `p50_ratio=${p50Ratio.toFixed(2)} p99_ratio=${p99Ratio.toFixed(1)}`,
      ];
      process.stdout.write(`${lines.join("\n")}\n`);
    } finally {
      await app.stop();
    }
  });
}

/** From SubmitMessage sent: to the run's first model call, and to the RPC's answer. */
interface Sample {
  readonly firstCall: number;
  readonly answered: number;
}

type Send = (conversation: string, text: string) => Promise<{ sample: Sample; settled: Promise<void> }>;

function sender(url: string, token: string, marks: Marks): Send {
  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
  const ingress = createClient(IngressService, createGrpcTransport({ baseUrl: url, interceptors: [bearer] }));
  return async (conversation, text) => {
    const started = performance.now();
    const { runId, duplicate } = await ingress.submitMessage({
      agentId: AGENT.id,
      conversationId: conversation,
      actor: { id: `${conversation}-user` },
      messageId: randomUUID(),
      text,
      connector: "bench",
    });
    const answered = performance.now() - started;
    if (duplicate) throw new Error(`message ${text} was taken for a duplicate`);
    const at = await marks.untilModelCall(text);
    return { sample: { firstCall: at - started, answered }, settled: marks.untilSettled(runId) };
  };
}

/** `count` messages over `conversations` lanes; a lane waits for its run to settle, thinks, and sends the next. */
async function phase(send: Send, label: string, count: number, conversations: number, thinkMs: number): Promise<Sample[]> {
  const samples: Sample[] = [];
  let next = 0;
  const lane = async (index: number): Promise<void> => {
    // Staggered starts, so the lanes do not march in step.
    await sleep(Math.floor((index * thinkMs) / Math.max(1, conversations)));
    while (next < count) {
      const i = next++;
      const { sample, settled } = await send(`${label}-conversation-${index}`, `${label} message ${i}`);
      samples.push(sample);
      await settled;
      if (thinkMs > 0) await sleep(thinkMs);
    }
  };
  await Promise.all(Array.from({ length: conversations }, (_, index) => lane(index)));
  return samples;
}

// ---------------------------------------------------------------------------------------------
// Baseline: the rows from message to claimed run, written by one raw transaction

const RUN_BUDGET = JSON.stringify(AGENT.budget);
const ZERO_USAGE_JSON = JSON.stringify(ZERO_USAGE);

async function rawPhase(db: pg.Client, options: Options): Promise<number[]> {
  await db.query("INSERT INTO agents (id, spec, revision) VALUES ('ingress-raw', $1::jsonb, 1) ON CONFLICT (id) DO NOTHING", [JSON.stringify(AGENT)]);
  for (let i = 0; i < options.warmup; i++) await rawTransaction(db, `warmup-${i}`, options.durability);
  const latencies: number[] = [];
  for (let i = 0; i < options.raw; i++) {
    const started = performance.now();
    await rawTransaction(db, `raw-${i}`, options.durability);
    latencies.push(performance.now() - started);
  }
  return latencies;
}

/**
 * What Keel writes between a message arriving and its run being claimed (ingress, then the
 * claim), as one transaction of plain statements with no reads, locks or notifications: a
 * floor, not a re-implementation.
 */
async function rawTransaction(db: pg.Client, key: string, durability: Durability): Promise<void> {
  const actorId = `${key}-user`;
  const runId = randomUUID();
  const messageRowId = randomUUID();
  const conversationId = randomUUID();
  const externalMessageId = randomUUID();
  await beginRaw(db, durability);
  try {
    await db.query("INSERT INTO actors (id, display_name) VALUES ($1, '') ON CONFLICT (id) DO NOTHING", [actorId]);
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, 'ingress-raw', $2, 'bench-raw')", [conversationId, `${key}-conversation`]);
    await db.query("INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($1, $2, $3, $4, $5, $6)", [
      messageRowId,
      conversationId,
      externalMessageId,
      actorId,
      `${key} message`,
      runId,
    ]);
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage,
         logical_request_id, request_received_at, trigger_count, event_seq)
       VALUES ($1, 'ingress-raw', $2, 'bench-raw', 'queued', $3, $4, $5::jsonb, $6::jsonb, $1, now(), 1, 1)`,
      [runId, conversationId, actorId, externalMessageId, RUN_BUDGET, ZERO_USAGE_JSON],
    );
    await db.query("INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, ordinal) VALUES ($1, $2, $3, $4, 1)", [
      runId,
      messageRowId,
      actorId,
      externalMessageId,
    ]);
    await db.query("INSERT INTO run_events (run_id, seq, kind, status, summary) VALUES ($1, 1, 'created', 'queued', 'message')", [runId]);
    await db.query(
      `INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id, external_conversation_id,
         reply_to_message_id, text, ack_state, addressed_actor_ids)
       VALUES ($1, $2, 'bench-raw', 'ack', $3, 'ingress-raw', $4, $5, $6, $7, 'working', $8::jsonb)`,
      [randomUUID(), `ack:${runId}:working`, runId, conversationId, `${key}-conversation`, externalMessageId, WORKING_ACK, JSON.stringify([actorId])],
    );
    // The claim.
    await db.query(
      `UPDATE runs SET status = 'running', lease_owner = 'raw', lease_epoch = 1, lease_expires_at = now() + interval '15 seconds',
         started_at = now(), updated_at = now(), event_seq = 2 WHERE id = $1`,
      [runId],
    );
    await db.query("INSERT INTO run_events (run_id, seq, kind, status, summary) VALUES ($1, 2, 'status_changed', 'running', 'claimed')", [runId]);
    await db.query("COMMIT");
  } catch (error) {
    await db.query("ROLLBACK").catch(() => {});
    throw error;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function withTimeout<T>(promise: Promise<T>, what: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} within ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}
