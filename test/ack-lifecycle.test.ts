// Triage by the fast model, side model calls recorded and counted, and the ack lifecycle
// (⏳ → started → thinking → ✅), through a real server, real PostgreSQL and scripted models
// (the openai SDK against the local OpenAI-compatible server for a failing classifier).
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ModelSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { withBudgetDefaults } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn as turn } from "../control-plane/src/fixtures/scripted-model.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { startOpenAiCompatibleServer, type OpenAiCompatibleServer } from "./support/openai-compatible-server.js";

const triageJson = (duration: string, shape: string, ackText: string | null) =>
  turn(JSON.stringify({ duration, shape, ack_text: ackText }), [], { inputTokens: 3, outputTokens: 2 });

function agent(id: string, primary: readonly ScriptedTurn[], fast: ModelSpec | undefined, extra: Partial<AgentSpec> = {}): AgentSpec {
  const main = scriptedModel(primary);
  return {
    ...DEMO_AGENT,
    id,
    models: { primary: main, fast: fast ?? main, decision: scriptedModel([turn("unclear")]) },
    interrupt: { coalesceWindowMs: 0, scope: "thread_scoped", maxSupersessions: 3, supersessionCeilingMs: 120_000 },
    ...extra,
  };
}

const reply = turn("Done: {{message}}");
/** A primary model slow enough that a follow-up lands while its first call is in flight. */
const slowFirst = (extra: Partial<ScriptedTurn> = {}) => turn("", [{ toolName: "no.such.tool.v1", argumentsJson: "{}" }], { delayMs: 1_200, inputTokens: 1, outputTokens: 1, ...extra });
const invalidTool = turn("", [{ toolName: "no.such.tool.v1", argumentsJson: "{}" }], { inputTokens: 1, outputTokens: 1 });

let server: OpenAiCompatibleServer;
let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  server = await startOpenAiCompatibleServer(() => ({ kind: "error", status: 500, message: "classifier down" }));
  const failing: ModelSpec = { ...scriptedModel([]), provider: "openai", model: "triage-model", endpoint: server.url, timeoutMs: 3_000 };
  const agents: AgentSpec[] = [
    agent("t-long", [reply], scriptedModel([triageJson("long", "graph_candidate", "On it: this will take a few minutes.")])),
    agent("t-trivial", [reply], scriptedModel([triageJson("trivial", "loop", null)])),
    agent("t-default", [reply], scriptedModel([triageJson("default", "loop", null)])),
    agent("t-offschema", [reply], scriptedModel([turn("sure, that looks long to me")])),
    agent("t-failed", [reply], failing),
    agent("t-slow", [reply], scriptedModel([{ ...triageJson("long", "loop", "late"), delayMs: 3_000 }], { timeoutMs: 400 })),
    agent("t-absent", [reply], undefined),
    agent("acks", [turn("thinking done", [], { delayMs: 300 })], scriptedModel([triageJson("default", "loop", null)])),
    agent("refined", [turn("answer: {{message}}", [], { delayMs: 900 })], scriptedModel([triageJson("default", "loop", null), turn("refines")])),
    // The follow-up's decision call alone is bigger than this budget; the loop's own calls are not.
    agent("frugal", [slowFirst(), invalidTool, reply], scriptedModel([triageJson("default", "loop", null), turn("independent")]), {
      budget: withBudgetDefaults({ maxInputTokens: 40 }),
    }),
  ];
  keel = await startTestKeel({
    agents,
    // Which runs' workers reserved their start acks themselves.
    wrapRunnerDeps: (deps) =>
      deps.lifecycle === undefined
        ? deps
        : { ...deps, lifecycle: { ...deps.lifecycle, reserveAcks: (runId, epoch, drafts) => (workerReservedAcks.add(runId), deps.lifecycle!.reserveAcks(runId, epoch, drafts)) } },
  });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
  await server?.close();
});

const workerReservedAcks = new Set<string>();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const TERMINAL = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.BUDGET_EXHAUSTED, RunStatus.CANCELLED];

async function submit(agentId: string, conversationId: string, messageId: string, text: string) {
  const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
  return ingress.submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId, text, connector: `conn-${conversationId}` });
}

async function settled(runId: string) {
  const runs = connectClient(RunService, keel.url, keel.tokens.operator);
  for (let i = 0; i < 300; i++) {
    const { run } = await runs.getRun({ runId });
    if (run !== undefined && TERMINAL.includes(run.status)) return run;
    await sleep(50);
  }
  throw new Error(`run ${runId} did not settle`);
}

interface TriageRow {
  triage_duration: string | null;
  triage_shape: string | null;
  triage_ack_text: string | null;
  triage_fallback: string | null;
  side_usage: Record<string, number>;
}

async function triageOf(runId: string): Promise<TriageRow> {
  for (let i = 0; i < 200; i++) {
    const { rows } = await db.query<TriageRow>(
      "SELECT triage_duration, triage_shape, triage_ack_text, triage_fallback, side_usage FROM runs WHERE id = $1",
      [runId],
    );
    if (rows[0]?.triage_duration != null) return rows[0];
    await sleep(50);
  }
  throw new Error(`run ${runId} was never triaged`);
}

async function sideCalls(runId: string) {
  const { rows } = await db.query<{ role: string; purpose: string; step_id: string | null; finish_reason: string; input_tokens: number; response_text: string }>(
    "SELECT role, purpose, step_id, finish_reason, input_tokens, response_text FROM model_calls WHERE run_id = $1 AND purpose IS NOT NULL ORDER BY created_at",
    [runId],
  );
  return rows;
}

async function emissionsOf(connector: string, until: (seen: Emission[]) => boolean): Promise<Emission[]> {
  const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
  const seen: Emission[] = [];
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 10_000);
  try {
    for await (const { emission } of emissions.subscribe({ connector }, { signal: abort.signal })) {
      if (emission !== undefined) seen.push(emission);
      if (until(seen)) break;
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
  return seen;
}

const settledAck = (e: Emission) => e.kind === EmissionKind.ACK && (e.ackState === AckState.SUCCEEDED || e.ackState === AckState.FAILED);

describe("triage", () => {
  it.each([
    ["t-long", { triage_duration: "long", triage_shape: "graph_candidate", triage_ack_text: "On it: this will take a few minutes.", triage_fallback: null }, "stop"],
    ["t-trivial", { triage_duration: "trivial", triage_shape: "loop", triage_ack_text: null, triage_fallback: null }, "stop"],
    ["t-default", { triage_duration: "default", triage_shape: "loop", triage_ack_text: null, triage_fallback: null }, "stop"],
  ])("%s: the fast model's answer is stored on the root run with its call", async (agentId, expected, finish) => {
    const { runId } = await submit(agentId, `c-${agentId}`, `m-${agentId}`, "build me a url shortener");
    expect((await settled(runId)).status).toBe(RunStatus.SUCCEEDED);
    const stored = await triageOf(runId);
    expect(stored).toMatchObject(expected);
    const calls = await sideCalls(runId);
    expect(calls).toEqual([expect.objectContaining({ role: "fast", purpose: "triage", step_id: null, finish_reason: finish, input_tokens: 3 })]);
    expect(stored.side_usage).toMatchObject({ modelCalls: 1, inputTokens: 3, outputTokens: 2 });
    expect(stored.side_usage.costMicroUsd).toBeTypeOf("number");
  });

  it.each([
    ["t-offschema", /off-schema|no JSON/, "off_schema"],
    ["t-failed", /500|classifier down/, "error"],
    ["t-slow", /no answer within 400 ms/, "timeout"],
  ])("%s: degrades to default/loop and records why, with the call", async (agentId, reason, finish) => {
    const { runId } = await submit(agentId, `c-${agentId}`, `m-${agentId}`, "build me a url shortener");
    expect((await settled(runId)).status).toBe(RunStatus.SUCCEEDED);
    const stored = await triageOf(runId);
    expect(stored).toMatchObject({ triage_duration: "default", triage_shape: "loop", triage_ack_text: null });
    expect(stored.triage_fallback).toMatch(reason);
    expect(await sideCalls(runId)).toEqual([expect.objectContaining({ role: "fast", purpose: "triage", finish_reason: finish })]);
  });

  it("without a fast model of its own, an agent's runs keep the defaults and make no call", async () => {
    const { runId } = await submit("t-absent", "c-t-absent", "m-t-absent", "hello");
    // Stored by the admission itself: already there when SubmitMessage answers, not left to a later write.
    const { rows: admitted } = await db.query<TriageRow>("SELECT triage_duration, triage_shape, triage_ack_text, triage_fallback, side_usage FROM runs WHERE id = $1", [runId]);
    expect(admitted[0]).toMatchObject({ triage_duration: "default", triage_shape: "loop", triage_ack_text: null, triage_fallback: "no fast model configured" });
    expect((await settled(runId)).status).toBe(RunStatus.SUCCEEDED);
    expect(await triageOf(runId)).toMatchObject({ triage_duration: "default", triage_shape: "loop", triage_fallback: "no fast model configured" });
    expect(await sideCalls(runId)).toEqual([]);
  });

  it("never delays the run: a classifier slower than the whole run lands after it settled", async () => {
    const timed = async (agentId: string, n: number) => {
      const started = performance.now();
      const { runId } = await submit(agentId, `c-${agentId}-timed-${n}`, `m-${agentId}-timed-${n}`, "quick one");
      await settled(runId);
      return { runId, ms: performance.now() - started };
    };
    const without = await timed("t-absent", 1);
    const slow = await timed("t-slow", 1);
    // The slow classifier gives up only at its 400 ms bound; the run (a 0 ms scripted model) is done long before.
    const stored = await triageOf(slow.runId);
    expect(stored.triage_fallback).toMatch(/no answer within 400 ms/);
    expect(slow.ms).toBeLessThan(without.ms + 350);
    expect(slow.ms).toBeLessThan(400);
  });
});

describe("the ack lifecycle", () => {
  it("Subscribe shows ⏳ working → started → thinking → ✅ in order, once each", async () => {
    const { runId } = await submit("acks", "c-acks", "m-acks", "think about it");
    // A run started at once has its start acks from the admission that started it, in order.
    const { rows: admitted } = await db.query<{ ack_state: string; started: boolean }>(
      "SELECT e.ack_state, r.lease_epoch = 1 AS started FROM emissions e JOIN runs r ON r.id = e.run_id WHERE e.run_id = $1 ORDER BY e.seq",
      [runId],
    );
    expect(admitted).toEqual(["working", "started", "thinking"].map((ack_state) => ({ ack_state, started: true })));
    const seen = await emissionsOf("conn-c-acks", (s) => s.some(settledAck));
    const acks = seen.filter((e) => e.kind === EmissionKind.ACK);
    expect(acks.map((e) => [e.ackState, e.text])).toEqual([
      [AckState.WORKING, "⏳"],
      [AckState.STARTED, "👀"],
      [AckState.THINKING, "🧠"],
      [AckState.SUCCEEDED, "✅"],
    ]);
    expect(acks.map((e) => e.idempotencyKey)).toEqual(["working", "started", "thinking", "settled"].map((s) => `ack:${runId}:${s}`));
    expect(acks.every((e) => e.replyToMessageId === "m-acks")).toBe(true);
    const seqs = seen.map((e) => Number(e.seq));
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    // Its worker wrote none of them: no transaction of its own beside the first model call.
    expect(workerReservedAcks.has(runId)).toBe(false);
  });

  it("a superseded request's successor does not repeat started or thinking", async () => {
    const first = await submit("refined", "c-refined", "m-refined-1", "write a poem");
    await sleep(400); // the first run's model call is in flight
    const second = await submit("refined", "c-refined", "m-refined-2", "about the sea, please");
    expect(second.runId).not.toBe(first.runId);
    expect((await settled(second.runId)).status).toBe(RunStatus.SUCCEEDED);
    const seen = await emissionsOf("conn-c-refined", (s) => s.some((e) => settledAck(e) && e.ackState === AckState.SUCCEEDED));
    const acks = seen.filter((e) => e.kind === EmissionKind.ACK);
    expect(acks.map((e) => e.ackState)).toEqual([AckState.WORKING, AckState.STARTED, AckState.THINKING, AckState.SUCCEEDED]);
    expect(new Set(acks.map((e) => e.idempotencyKey)).size).toBe(acks.length);
    // The follow-up classification is recorded against the run it was about.
    expect(await sideCalls(first.runId)).toEqual(
      expect.arrayContaining([expect.objectContaining({ role: "decision", purpose: "follow_up", response_text: "refines", finish_reason: "stop" })]),
    );
  });
});

describe("decision calls count against the run's budget", () => {
  it("a follow-up classification bigger than the budget exhausts the run it was about", async () => {
    const first = await submit("frugal", "c-frugal", "m-frugal-1", "tidy the repo");
    await sleep(400); // inside the first model call (1.2 s)
    const second = await submit("frugal", "c-frugal", "m-frugal-2", "also, what is the weather?");
    expect(second.runId).not.toBe(first.runId);
    const run = await settled(first.runId);
    expect(run.status).toBe(RunStatus.BUDGET_EXHAUSTED);
    const calls = await sideCalls(first.runId);
    const decision = calls.find((c) => c.purpose === "follow_up");
    expect(decision).toMatchObject({ role: "decision", step_id: null, response_text: "independent" });
    expect(decision!.input_tokens).toBeGreaterThan(40);
    const { rows } = await db.query<{ exhausted_dimension: string; side_usage: Record<string, number> }>(
      "SELECT exhausted_dimension, side_usage FROM runs WHERE id = $1",
      [first.runId],
    );
    expect(rows[0]?.exhausted_dimension).toBe("input_tokens");
    expect(rows[0]?.side_usage.inputTokens).toBeGreaterThan(decision!.input_tokens);
    // The queued request had no decision call: the same script, the same budget, it finishes.
    expect((await settled(second.runId)).status).toBe(RunStatus.SUCCEEDED);
  });
});
