// A message to a conversation this process last saw quiet starts its first model call before
// admission reads the conversation (conversation/quiet-conversations.ts). These tests hold the
// guess to its rule: it goes ahead of the read, it stands only when the read agrees, and a guess
// the read disproves leaves no run, no emission and no second reply behind.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import type { ModelTurn } from "../control-plane/src/domain/transcript.js";
import type { ModelRequest } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { grpcClient } from "./support/clients.js";
import { logLines } from "./support/log-lines.js";

const AGENT: AgentSpec = { ...DEMO_AGENT, id: "quiet-agent", interrupt: { ...DEMO_AGENT.interrupt, coalesceWindowMs: 0 } };
const WITHDRAWN = "was not started: its conversation was not as this process last saw it";

/** The workers' dependencies with the scripted model's calls passed through `around`. */
function aroundScriptedModel(around: (request: ModelRequest, call: (request: ModelRequest) => Promise<ModelTurn>) => Promise<ModelTurn>) {
  return (deps: RunnerDeps): RunnerDeps => {
    const scripted = deps.providers.scripted;
    return { ...deps, providers: { ...deps.providers, scripted: { ...scripted, complete: (request) => around(request, (r) => scripted.complete(r)) } } };
  };
}

/** Records the text each model call answers (the last user message). */
const recordingCalls = (calls: string[]) =>
  aroundScriptedModel((request, call) => {
    const user = request.messages.findLast((m) => m.role === "user");
    if (user !== undefined) calls.push(user.content);
    return call(request);
  });

/** Holds the conversation's row lock, which every admission to it takes with its first statement. */
async function lockConversation(databaseUrl: string, conversationId: string): Promise<{ release: () => Promise<void> }> {
  const locker = new pg.Client({ connectionString: databaseUrl });
  await locker.connect();
  await locker.query("BEGIN");
  const { rowCount } = await locker.query("SELECT 1 FROM conversations WHERE agent_id = $1 AND external_id = $2 FOR UPDATE", [AGENT.id, conversationId]);
  expect(rowCount).toBe(1);
  return {
    release: async () => {
      await locker.query("COMMIT");
      await locker.end();
    },
  };
}

/** A Keel whose model calls are recorded by the text they answer, with its debug log and a client on its database. */
function keelRecordingCalls(env: Record<string, string>) {
  const calls: string[] = [];
  const { log, lines } = logLines("debug");
  let keel: TestKeel | undefined;
  let db: pg.Client | undefined;
  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 2,
      agents: [AGENT],
      env,
      log,
      wrapRunnerDeps: recordingCalls(calls),
    });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
  }, 60_000);
  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });
  const h = { calls, lines, keel: () => keel!, db: () => db! };
  const ingress = () => grpcClient(IngressService, h.keel().url, h.keel().tokens.connector);
  const send = (conversationId: string, messageId: string, text: string) =>
    ingress().submitMessage({ agentId: AGENT.id, conversationId, actor: { id: "ana" }, messageId, text, connector: "test" });
  const statusOf = async (runId: string) => (await h.db().query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status;
  const settled = (runId: string) => expect.poll(() => statusOf(runId), { timeout: 10_000 }).toBe("succeeded");
  const lock = (conversationId: string) => lockConversation(h.keel().databaseUrl, conversationId);
  return { ...h, send, statusOf, settled, lockConversation: lock };
}

describe("a quiet conversation's next request starts before admission reads it", () => {
  const h = keelRecordingCalls({});

  it("makes the first model call while the admission still waits for the conversation, and keeps that one call", async () => {
    const first = await h.send("c-quiet", "m1", "first");
    await h.settled(first.runId);

    const lock = await h.lockConversation("c-quiet");
    const before = h.keel().app.speculativeStarts();
    const pending = h.send("c-quiet", "m2", "second");
    try {
      // The admission cannot have read the conversation: its row is locked. The call goes ahead anyway.
      await expect.poll(() => h.calls.includes("second"), { timeout: 5_000 }).toBe(true);
      const { rows } = await h.db().query<{ n: number }>("SELECT count(*)::int AS n FROM messages WHERE external_id = 'm2'");
      expect(rows[0]?.n).toBe(0);
    } finally {
      await lock.release();
    }
    const second = await pending;
    await h.settled(second.runId);

    // The guess stood: one call for the message, one run, claimed at admission, one reply.
    expect(h.calls.filter((text) => text === "second")).toHaveLength(1);
    expect(h.lines.filter((line) => line.includes(WITHDRAWN))).toEqual([]);
    expect(h.keel().app.speculativeStarts()).toEqual({ started: before.started + 1, withdrawn: before.withdrawn });
    const events = await h.db().query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [second.runId]);
    expect(events.rows[1]?.summary).toMatch(/^claimed by worker-.* at epoch 1$/);
    const runs = await h.db().query<{ n: number }>("SELECT count(*)::int AS n FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.external_id = 'c-quiet'");
    expect(runs.rows[0]?.n).toBe(2);
    const replies = await h.db().query<{ text: string }>("SELECT text FROM emissions WHERE run_id = $1 AND kind = 'reply'", [second.runId]);
    expect(replies.rows.map((r) => r.text)).toEqual(["Hello from Keel. You said: second"]);
  }, 60_000);

  it("withdraws a guess the read disproves: the call made on it leaves nothing, and the run made from the read answers", async () => {
    const first = await h.send("c-edited", "m1", "before the edit");
    await h.settled(first.runId);
    // Another replica changed the agent: this process still remembers the old spec.
    await h
      .db()
      .query(
        `UPDATE agents SET spec = jsonb_set(spec, '{models,primary,scriptedTurns,0,replyText}', '"Edited agent: {{message}}"'), revision = revision + 1 WHERE id = $1`,
        [AGENT.id],
      );
    const before = h.keel().app.speculativeStarts();
    // Held until the guessed call is seen, so the guess is surely made before the read disproves it.
    const lock = await h.lockConversation("c-edited");
    const pending = h.send("c-edited", "m2", "after the edit");
    try {
      await expect.poll(() => h.calls.includes("after the edit"), { timeout: 5_000 }).toBe(true);
    } finally {
      await lock.release();
    }
    const second = await pending;
    await h.settled(second.runId);
    expect(h.keel().app.speculativeStarts()).toEqual({ started: before.started + 1, withdrawn: before.withdrawn + 1 });
    // Operators see the same counts, each withdrawal an aborted call.
    const metrics = await (await fetch(`${h.keel().http1Url}/metrics`, { headers: { authorization: `Bearer ${h.keel().tokens.operator}` } })).text();
    expect(metrics).toContain(`keel_speculative_starts_withdrawn_total ${before.withdrawn + 1}`);

    // The guess was made (a call for the message began before the read) and withdrawn ...
    await expect.poll(() => h.lines.find((line) => line.includes(WITHDRAWN)), { timeout: 5_000 }).toBeDefined();
    const withdrawn = JSON.parse(h.lines.find((line) => line.includes(WITHDRAWN))!) as { runId: string };
    expect(withdrawn.runId).not.toBe(second.runId);
    expect(h.calls.filter((text) => text === "after the edit")).toHaveLength(2);
    // ... and its run never existed: no row, no ack, no reply. The reply is the edited agent's, once.
    for (const table of ["runs", "run_events", "emissions", "run_steps"]) {
      const column = table === "runs" ? "id" : "run_id";
      const { rows } = await h.db().query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [withdrawn.runId]);
      expect({ table, rows: rows[0]?.n }).toEqual({ table, rows: 0 });
    }
    const replies = await h.db().query<{ text: string }>(
      "SELECT e.text FROM emissions e JOIN runs r ON r.id = e.run_id JOIN conversations c ON c.id = r.conversation_id WHERE c.external_id = 'c-edited' AND e.kind = 'reply' ORDER BY e.created_at",
    );
    expect(replies.rows.map((r) => r.text)).toEqual(["Hello from Keel. You said: before the edit", "Edited agent: after the edit"]);
  }, 60_000);

  it("makes no guess for a message id it admitted lately: a redelivery is a duplicate, with no model call", async () => {
    const first = await h.send("c-redelivered", "m1", "only once");
    await h.settled(first.runId);
    const again = await h.send("c-redelivered", "m1", "only once");
    expect(again).toMatchObject({ runId: first.runId, duplicate: true });
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(h.calls.filter((text) => text === "only once")).toHaveLength(1);
  }, 60_000);
});

describe("with KEEL_SPECULATIVE_START=0", () => {
  const h = keelRecordingCalls({ KEEL_SPECULATIVE_START: "0" });

  it("makes no model call before admission has read the conversation", async () => {
    const first = await h.send("c-quiet", "m1", "first");
    await h.settled(first.runId);
    const lock = await h.lockConversation("c-quiet");
    const pending = h.send("c-quiet", "m2", "second");
    try {
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(h.calls).not.toContain("second");
    } finally {
      await lock.release();
    }
    await h.settled((await pending).runId);
    expect(h.calls.filter((text) => text === "second")).toHaveLength(1);
    expect(h.keel().app.speculativeStarts()).toEqual({ started: 0, withdrawn: 0 });
  }, 60_000);
});

describe("a guess made on one replica while another runs the conversation", () => {
  const a = logLines("debug");
  const guessed: string[] = [];
  let replicaA: TestKeel | undefined;
  let replicaB: TestKeel | undefined;
  let db: pg.Client | undefined;
  beforeAll(async () => {
    replicaA = await startTestKeel({
      workers: 2,
      agents: [AGENT],
      log: a.log,
      wrapRunnerDeps: recordingCalls(guessed),
    });
    // Replica B's model takes two seconds, so its run is live when A is asked next.
    replicaB = await startTestKeel({
      workers: 2,
      databaseUrl: replicaA.databaseUrl,
      agents: [],
      wrapRunnerDeps: aroundScriptedModel(async (request, call) => {
        await new Promise((resolve) => setTimeout(resolve, 2_000));
        return call(request);
      }),
    });
    db = new pg.Client({ connectionString: replicaA.databaseUrl });
    await db.connect();
  }, 60_000);
  afterAll(async () => {
    await db?.end();
    await replicaB?.stop();
    await replicaA?.stop();
  });

  it("is withdrawn when the read finds the other replica's run live, and the message is admitted as usual", async () => {
    const send = (keel: TestKeel, messageId: string, text: string) =>
      grpcClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
        agentId: AGENT.id,
        conversationId: "c-shared",
        actor: { id: "ana" },
        messageId,
        text,
        connector: "test",
      });
    const statusOf = async (runId: string) => (await db!.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status;

    // A saw the conversation go quiet; B then starts a run in it that A knows nothing of.
    const first = await send(replicaA!, "m1", "first");
    await expect.poll(() => statusOf(first.runId), { timeout: 10_000 }).toBe("succeeded");
    const second = await send(replicaB!, "m2", "second");
    expect(["queued", "running"]).toContain(await statusOf(second.runId));

    // The conversation's row is held until A's guessed call is seen: the guess comes before the read.
    const lock = await lockConversation(replicaA!.databaseUrl, "c-shared");
    const pending = send(replicaA!, "m3", "third");
    try {
      await expect.poll(() => guessed.includes("third"), { timeout: 5_000 }).toBe(true);
    } finally {
      await lock.release();
    }
    const third = await pending;
    expect(replicaA!.app.speculativeStarts()).toEqual({ started: 1, withdrawn: 1 });
    const line = a.lines.find((l) => l.includes(WITHDRAWN));
    expect(line).toBeDefined();
    const withdrawn = (JSON.parse(line!) as { runId: string }).runId;
    expect([first.runId, second.runId, third.runId]).not.toContain(withdrawn);

    // Every run of the conversation ends; the guessed one never existed; each request is answered once.
    await expect
      .poll(async () => (await db!.query<{ n: number }>("SELECT count(*)::int AS n FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.external_id = 'c-shared' AND r.status NOT IN ('succeeded', 'cancelled')")).rows[0]?.n, { timeout: 15_000 })
      .toBe(0);
    for (const table of ["runs", "run_events", "emissions", "run_steps"]) {
      const column = table === "runs" ? "id" : "run_id";
      const { rows } = await db!.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [withdrawn]);
      expect({ table, rows: rows[0]?.n }).toEqual({ table, rows: 0 });
    }
    const replies = await db!.query<{ reply_to_message_id: string; n: number }>(
      `SELECT e.reply_to_message_id, count(*)::int AS n FROM emissions e JOIN conversations c ON c.id = e.conversation_id
       WHERE c.external_id = 'c-shared' AND e.kind = 'reply' GROUP BY e.reply_to_message_id`,
    );
    expect(replies.rows.every((row) => row.n === 1)).toBe(true);
    const m3 = await db!.query<{ run_id: string | null }>("SELECT m.run_id FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.external_id = 'c-shared' AND m.external_id = 'm3'");
    expect(m3.rows[0]?.run_id).not.toBeNull();
  }, 60_000);
});
