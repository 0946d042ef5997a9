// The progress supervisor through a real server, real PostgreSQL and scripted models, on a manual
// clock: the cadence (60 s, then every 3 min), triage long/trivial/default, report_progress
// checkpoints with the one-minute gap, a 10-minute run seen through Subscribe, and a takeover
// that keeps the cadence. Every step advances the clock, then waits for what must follow.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ModelSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { connectClient } from "./support/clients.js";
import { createGate } from "./support/gate-tool.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { ManualClock } from "./support/manual-clock.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const S = 1000;
const MIN = 60 * S;

async function until<T>(probe: () => Promise<T | false | undefined>, what: string, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== false && value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

const triage = (duration: string, ackText: string | null = null) =>
  scriptedModel([turn(JSON.stringify({ duration, shape: "loop", ack_text: ackText }), [], { inputTokens: 1, outputTokens: 1 })]);
const gateTurn = (name: string) => turn("", [{ toolName: "test.gate.v1", argumentsJson: JSON.stringify({ name }) }]);
const report = (...calls: [kind: string, text: string][]) =>
  turn("", calls.map(([kind, text]) => ({ toolName: "keel.report_progress.v1", argumentsJson: JSON.stringify({ kind, text }) })));
const replyTurn = turn("Done: {{message}}");

const models = (primary: ScriptedTurn[], fast: ModelSpec) => ({ primary: scriptedModel(primary), fast, decision: scriptedModel([turn("unclear")]) });

function agent(id: string, duration: string, turns: ScriptedTurn[], ackText: string | null = null): AgentSpec {
  return {
    ...DEMO_AGENT,
    id,
    models: { primary: scriptedModel(turns), fast: triage(duration, ackText), decision: scriptedModel([turn("unclear")]) },
    tools: toolGrants(["test.gate.v1"]),
    interrupt: { coalesceWindowMs: 0, scope: "thread_scoped", maxSupersessions: 3, supersessionCeilingMs: 120_000 },
  };
}

const clock = new ManualClock(new Date("2026-12-01T09:00:00Z"));
const gate = createGate();
let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({
    clock,
    // One spare worker for the takeover, whatever an earlier test left at a gate.
    workers: 3,
    tools: [gate.tool],
    progress: { tickMs: 20 },
    agents: [
      agent("p-default", "default", [gateTurn("default"), replyTurn]),
      { ...agent("p-offschema", "default", [gateTurn("offschema"), replyTurn]), models: models([gateTurn("offschema"), replyTurn], scriptedModel([turn("that looks long to me")])) },
      {
        ...agent("p-slow", "default", [gateTurn("slow"), replyTurn]),
        models: models([gateTurn("slow"), replyTurn], scriptedModel([{ ...turn('{"duration":"long","shape":"loop","ack_text":"late"}'), delayMs: 3_000 }], { timeoutMs: 300 })),
      },
      agent("p-cancel", "default", [gateTurn("cancel"), replyTurn]),
      {
        ...agent("p-summary", "default", [gateTurn("summary"), replyTurn]),
        models: models(
          [gateTurn("summary"), replyTurn],
          scriptedModel([
            turn(JSON.stringify({ duration: "default", shape: "loop", ack_text: null }), [], { inputTokens: 1, outputTokens: 1 }),
            turn(JSON.stringify({ summary: "Halfway through the parser's tests; nothing has failed yet." }), [], { inputTokens: 5, outputTokens: 7 }),
          ]),
        ),
      },
      agent("p-long", "long", [gateTurn("long"), replyTurn], "On it: this one takes a few minutes."),
      agent("p-trivial", "trivial", [gateTurn("trivial"), replyTurn]),
      agent("p-checkpoint", "default", [
        gateTurn("cp0"),
        report(["plan", "read the parser, then fix it"]),
        gateTurn("cp1"),
        report(["milestone", "found the bug"], ["replan", "rewrite the tokenizer first"]),
        gateTurn("cp2"),
        replyTurn,
      ]),
      agent("p-ten", "default", [report(["plan", "run the whole suite"]), gateTurn("ten"), replyTurn]),
      agent("p-takeover", "default", [gateTurn("take-a"), gateTurn("take-b"), replyTurn]),
      // A demo agent's cadence: lowered, and a zero that cannot switch anything off.
      { ...agent("p-fast", "default", [gateTurn("fast"), replyTurn]), progress: { firstAfterMs: 5 * S, everyMs: 10 * S, minGapMs: 0 } },
    ],
  });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

async function submit(agentId: string): Promise<string> {
  const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
  const { runId } = await ingress.submitMessage({
    agentId,
    conversationId: `c-${agentId}`,
    actor: { id: "alice" },
    messageId: `m-${agentId}`,
    text: "fix the parser",
    connector: `conn-${agentId}`,
  });
  return runId;
}

interface NoticeRow {
  seq: number;
  text: string;
  source: string;
  covers: string[];
  emission_seq: number;
  idempotency_key: string;
  run_id: string;
}

async function notices(runIds: readonly string[]): Promise<NoticeRow[]> {
  const { rows } = await db.query<NoticeRow>(
    `SELECT pe.seq, pe.text, pe.source, pe.covers, e.seq::int AS emission_seq, e.idempotency_key, pe.run_id
     FROM progress_events pe JOIN emissions e ON e.id = pe.emission_id
     WHERE pe.run_id = ANY($1::uuid[]) ORDER BY pe.seq`,
    [runIds],
  );
  return rows;
}

const noticeCount = (runId: string, n: number) => until(async () => ((await notices([runId])).length >= n ? await notices([runId]) : false), `${n} notices`);

async function triaged(runId: string): Promise<void> {
  await until(async () => (await db.query("SELECT 1 FROM runs WHERE id = $1 AND triage_duration IS NOT NULL", [runId])).rowCount === 1, "triage");
}

async function settled(runId: string): Promise<RunStatus> {
  const runs = connectClient(RunService, keel.url, keel.tokens.operator);
  return until(async () => {
    const { run } = await runs.getRun({ runId });
    return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED].includes(run.status) ? run.status : false;
  }, `run ${runId} to settle`);
}

/** Some real time for a supervisor that would send something to do so: an absence is checked after it. */
const quiet = () => sleep(300);

describe("progress cadence", () => {
  it.each([
    ["p-default", "default", null],
    ["p-offschema", "offschema", /JSON/],
    ["p-slow", "slow", /within 300 ms/],
  ])("%s: the first notice after 60 s of silence, then every 3 min, with the facts", async (agentId, name, fellBack) => {
    const runId = await submit(agentId);
    await gate.reached(name);
    await triaged(runId);
    // A classifier that answered off-schema or too late leaves the default, and the same cadence.
    const { rows: stored } = await db.query<{ triage_duration: string; triage_fallback: string | null }>(
      "SELECT triage_duration, triage_fallback FROM runs WHERE id = $1",
      [runId],
    );
    expect(stored[0]?.triage_duration).toBe("default");
    if (fellBack === null) expect(stored[0]?.triage_fallback).toBeNull();
    else expect(stored[0]?.triage_fallback).toMatch(fellBack);
    clock.advance(59 * S);
    await quiet();
    expect(await notices([runId])).toEqual([]);
    clock.advance(1 * S);
    const [first] = await noticeCount(runId, 1);
    expect(first).toMatchObject({ seq: 1, source: "deadline", text: `Still on it: running test.gate.v1 \`${name}\` for 1 min.` });
    clock.advance(179 * S);
    await quiet();
    expect(await notices([runId])).toHaveLength(1);
    clock.advance(1 * S);
    const second = (await noticeCount(runId, 2))[1];
    expect(second).toMatchObject({ seq: 2, source: "deadline", text: `Still on it: running test.gate.v1 \`${name}\` for 4 min.` });
    gate.open(name);
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
    expect((await notices([runId])).map((n) => n.idempotency_key)).toEqual([1, 2].map((seq) => `progress:${runId}:${seq}`));
  });

  it("long: the stashed ack copy at once, then the ordinary cadence", async () => {
    const runId = await submit("p-long");
    await gate.reached("long");
    const [first] = await noticeCount(runId, 1);
    expect(first).toMatchObject({ seq: 1, source: "triage_ack", text: "On it: this one takes a few minutes." });
    clock.advance(179 * S);
    await quiet();
    expect(await notices([runId])).toHaveLength(1);
    clock.advance(1 * S);
    expect((await noticeCount(runId, 2))[1]).toMatchObject({ source: "deadline", text: "Still on it: running test.gate.v1 `long` for 3 min." });
    gate.open("long");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
  });

  it("trivial: no message-shaped notice at all, the reactions unchanged", async () => {
    const runId = await submit("p-trivial");
    await gate.reached("trivial");
    await triaged(runId);
    for (const step of [60 * S, 180 * S, 180 * S]) {
      clock.advance(step);
      await quiet();
    }
    gate.open("trivial");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
    expect(await notices([runId])).toEqual([]);
    const { rows } = await db.query<{ kind: string; ack_state: string | null }>("SELECT kind, ack_state FROM emissions WHERE run_id = $1 ORDER BY seq", [runId]);
    expect(rows.map((r) => r.ack_state ?? r.kind)).toEqual(["working", "started", "thinking", "reply", "succeeded"]);
  });

  it("checkpoints go out sooner than the cadence, never within 1 min of the previous notice, and together as one", async () => {
    const runId = await submit("p-checkpoint");
    await gate.reached("cp0");
    await triaged(runId);
    gate.open("cp0");
    const [plan] = await noticeCount(runId, 1);
    // Beside the checkpoint, whatever the run does as the notice is composed (the next step may have begun).
    expect(plan).toMatchObject({ source: "checkpoint", covers: [expect.any(String)] });
    expect(plan!.text).toMatch(/^Plan: read the parser, then fix it \(/);
    await gate.reached("cp1");
    gate.open("cp1");
    await gate.reached("cp2");
    // The milestone and the replan came in one step, straight after the plan's notice: they wait for the gap.
    clock.advance(59 * S);
    await quiet();
    expect(await notices([runId])).toHaveLength(1);
    clock.advance(1 * S);
    const second = (await noticeCount(runId, 2))[1]!;
    expect(second).toMatchObject({ source: "checkpoint", text: "Change of plan: rewrite the tokenizer first (running test.gate.v1 `cp2` for 1 min)" });
    expect(second.covers).toHaveLength(2);
    // Then silence: the cadence runs from the last notice.
    clock.advance(179 * S);
    await quiet();
    expect(await notices([runId])).toHaveLength(2);
    clock.advance(1 * S);
    expect((await noticeCount(runId, 3))[2]).toMatchObject({ source: "deadline", text: "Still on it: running test.gate.v1 `cp2` for 4 min." });
    gate.open("cp2");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
    expect(await notices([runId])).toHaveLength(3);
  });
});

describe("the fast model's summary", () => {
  it("words a cadence notice without a checkpoint, recorded and counted as a side call", async () => {
    const runId = await submit("p-summary");
    await gate.reached("summary");
    await triaged(runId);
    clock.advance(60 * S);
    expect((await noticeCount(runId, 1))[0]).toMatchObject({ source: "deadline", text: "Halfway through the parser's tests; nothing has failed yet." });
    gate.open("summary");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
    const { rows } = await db.query<{ purpose: string; role: string; finish_reason: string; step_id: string | null }>(
      "SELECT purpose, role, finish_reason, step_id FROM model_calls WHERE run_id = $1 AND purpose IS NOT NULL ORDER BY created_at",
      [runId],
    );
    expect(rows).toEqual([
      { purpose: "triage", role: "fast", finish_reason: "stop", step_id: null },
      { purpose: "progress", role: "fast", finish_reason: "stop", step_id: null },
    ]);
    const { rows: usage } = await db.query<{ side_usage: Record<string, number> }>("SELECT side_usage FROM runs WHERE id = $1", [runId]);
    expect(usage[0]?.side_usage).toMatchObject({ modelCalls: 2, inputTokens: 6, outputTokens: 8 });
  });

  it("an off-schema answer leaves the facts, and the call is still counted", async () => {
    // p-default's fast model answers every call with its triage JSON: no summary in it.
    const { rows } = await db.query<{ finish_reason: string }>(
      "SELECT m.finish_reason FROM model_calls m JOIN runs r ON r.id = m.run_id WHERE r.agent_id = 'p-default' AND m.purpose = 'progress'",
    );
    expect(rows.length).toBeGreaterThanOrEqual(2);
    expect(new Set(rows.map((r) => r.finish_reason))).toEqual(new Set(["off_schema"]));
  });
});

describe("stale attempts", () => {
  it("a run whose cancellation was asked for sends no notice, whatever the clock says", async () => {
    const runId = await submit("p-cancel");
    await gate.reached("cancel");
    await triaged(runId);
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    await ingress.cancelRun({ runId, actor: { id: "alice" }, reason: "not needed" });
    await until(async () => (await db.query("SELECT 1 FROM runs WHERE id = $1 AND cancel_requested_by_actor_id IS NOT NULL", [runId])).rowCount === 1, "the cancellation");
    clock.advance(60 * S);
    await quiet();
    clock.advance(180 * S);
    await quiet();
    gate.open("cancel");
    expect(await settled(runId)).toBe(RunStatus.CANCELLED);
    expect(await notices([runId])).toEqual([]);
  });
});

describe("per-agent cadence", () => {
  it("an agent's setting lowers the delays", async () => {
    const runId = await submit("p-fast");
    await gate.reached("fast");
    await triaged(runId);
    clock.advance(4 * S);
    await quiet();
    expect(await notices([runId])).toEqual([]);
    clock.advance(1 * S);
    expect((await noticeCount(runId, 1))[0]).toMatchObject({ text: "Still on it: running test.gate.v1 `fast` for 5 s." });
    clock.advance(10 * S);
    expect((await noticeCount(runId, 2))[1]).toMatchObject({ text: "Still on it: running test.gate.v1 `fast` for 15 s." });
    gate.open("fast");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
  });
});

describe("a 10-minute run through Subscribe", () => {
  it("shows the plan, three cadence notices in order, then the reply, and nothing after it", async () => {
    const connector = "conn-p-ten";
    const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
    const seen: Emission[] = [];
    const abort = new AbortController();
    const reading = (async () => {
      try {
        for await (const { emission } of emissions.subscribe({ connector }, { signal: abort.signal })) if (emission !== undefined) seen.push(emission);
      } catch (error) {
        if (!abort.signal.aborted) throw error;
      }
    })();
    try {
      const runId = await submit("p-ten");
      await gate.reached("ten");
      await until(() => Promise.resolve(seen.some((e) => e.kind === EmissionKind.PROGRESS)), "the plan's notice");
      // Ten minutes in 30-second steps; at each deadline, the notice before the clock moves on.
      for (let t = 30 * S; t <= 10 * MIN; t += 30 * S) {
        clock.advance(30 * S);
        if (t % (3 * MIN) === 0) {
          const expected = t / (3 * MIN) + 1;
          await until(() => Promise.resolve(seen.filter((e) => e.kind === EmissionKind.PROGRESS).length >= expected), `notice ${expected} at ${t / S} s`);
        }
      }
      gate.open("ten");
      expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
      await until(() => Promise.resolve(seen.some((e) => e.kind === EmissionKind.ACK && e.ackState === AckState.SUCCEEDED)), "the settled ack");
      // Long after the reply, still nothing more.
      clock.advance(10 * MIN);
      await quiet();
      const progressText = (text: string) => (text.startsWith("Plan: run the whole suite (") ? "Plan" : text);
      const shown = seen.map((e) =>
        e.kind === EmissionKind.PROGRESS ? `progress: ${progressText(e.text)}` : e.kind === EmissionKind.REPLY ? "reply" : `ack ${AckState[e.ackState]}`,
      );
      expect(shown).toEqual([
        "ack WORKING",
        "ack STARTED",
        "ack THINKING",
        "progress: Plan",
        "progress: Still on it: running test.gate.v1 `ten` for 3 min.",
        "progress: Still on it: running test.gate.v1 `ten` for 6 min.",
        "progress: Still on it: running test.gate.v1 `ten` for 9 min.",
        "reply",
        "ack SUCCEEDED",
      ]);
      const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM emissions WHERE run_id = $1 AND kind = 'progress'", [runId]);
      expect(rows[0]?.n).toBe(4);
      // Progress never settles a run: the reply is the model's, the status its own.
      const { rows: run } = await db.query<{ final_reply: string }>("SELECT final_reply FROM runs WHERE id = $1", [runId]);
      expect(run[0]?.final_reply).toBe("Done: fix the parser");
    } finally {
      abort.abort();
      await reading;
    }
  });
});

describe("takeover", () => {
  it("a worker that takes the run over keeps its cadence and the stale claim sends nothing", async () => {
    const runId = await submit("p-takeover");
    await gate.reached("take-a");
    await triaged(runId);
    clock.advance(60 * S);
    await noticeCount(runId, 1);
    clock.advance(40 * S);
    // The lease is taken away as if this worker had stalled: another worker claims the run at a new epoch.
    const { rows: before } = await db.query<{ lease_epoch: string }>("SELECT lease_epoch FROM runs WHERE id = $1", [runId]);
    await db.query("UPDATE runs SET lease_owner = 'stalled', lease_expires_at = now() - interval '1 hour' WHERE id = $1", [runId]);
    await gate.reached("take-b");
    const { rows: after } = await db.query<{ lease_epoch: string }>("SELECT lease_epoch FROM runs WHERE id = $1", [runId]);
    expect(Number(after[0]?.lease_epoch)).toBeGreaterThan(Number(before[0]?.lease_epoch));
    // A fresh supervisor would speak at 60 s of its own; this one follows the ledger: 3 min after the first notice.
    clock.advance(60 * S);
    await quiet();
    clock.advance(79 * S);
    await quiet();
    expect(await notices([runId])).toHaveLength(1);
    clock.advance(1 * S);
    const second = (await noticeCount(runId, 2))[1];
    expect(second).toMatchObject({ seq: 2, source: "deadline", text: "Still on it: running test.gate.v1 `take-b` for 2 min 20 s." });
    gate.open("take-b");
    expect(await settled(runId)).toBe(RunStatus.SUCCEEDED);
    expect(await notices([runId])).toHaveLength(2);
  });
});
