// A run admission hands to an idle worker starts before the admission's COMMIT returns: its
// first model call overlaps the flush. These tests hold Keel to the rule that makes that
// safe: only the model call goes ahead; if the commit fails the call is aborted and the run
// leaves no trace, and the worker goes back to work.
import { randomUUID } from "node:crypto";
import { Code, ConnectError } from "@connectrpc/connect";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel, type TestKeelOptions } from "./support/keel-fixture.js";
import { grpcClient } from "./support/clients.js";
import { logLines } from "./support/log-lines.js";

/** A model call that would take a minute unless aborted. */
const SLOW: AgentSpec = {
  ...DEMO_AGENT,
  id: "slow-model",
  interrupt: { ...DEMO_AGENT.interrupt, coalesceWindowMs: 0 },
  models: {
    ...DEMO_AGENT.models,
    primary: { ...DEMO_AGENT.models.primary, scriptedTurns: [{ replyText: "late", toolCalls: [], delayMs: 60_000, inputTokens: 0, outputTokens: 0 }] },
  },
};
const QUICK: AgentSpec = { ...DEMO_AGENT, id: "quick-model", interrupt: { ...DEMO_AGENT.interrupt, coalesceWindowMs: 0 } };
const REFUSED = "refused at commit";

/** Within a describe: a Keel whose log lines land in `lines`, and a plain client on its database. */
function keelWithLog(options: TestKeelOptions, level: string, setup: (db: pg.Client) => Promise<void> = async () => {}) {
  const { log, lines } = logLines(level);
  let keel: TestKeel | undefined;
  let db: pg.Client | undefined;
  beforeAll(async () => {
    keel = await startTestKeel({ ...options, log });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    await setup(db);
  }, 60_000);
  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });
  return {
    lines,
    keel: () => keel!,
    db: () => db!,
  };
}

describe("admission hands a run to a worker before its commit returns", () => {
  // One worker, so the second message can only be served if the first claim let it go.
  const h = keelWithLog({ workers: 1, agents: [SLOW, QUICK] }, "warn", async (db) => {
    // A real failure at COMMIT: a deferred constraint trigger refuses one message's text.
    await db.query(`
      CREATE FUNCTION refuse_marked_message() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.text = '${REFUSED}' THEN RAISE EXCEPTION 'test refuses this message at commit'; END IF;
        RETURN NULL;
      END $$;
      CREATE CONSTRAINT TRIGGER refuse_marked_message AFTER INSERT ON messages
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_marked_message();`);
  });
  const lines = h.lines;

  it("aborts the model call and writes nothing when the admission does not commit", async () => {
    const ingress = grpcClient(IngressService, h.keel().url, h.keel().tokens.connector);
    const started = Date.now();
    const failed = await ingress
      .submitMessage({ agentId: SLOW.id, conversationId: "c-refused", actor: { id: "ana" }, messageId: "m-refused", text: REFUSED, connector: "test" })
      .then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
    expect(failed?.code).toBe(Code.Internal);

    // The worker started the run (the handoff happened) and dropped it long before the minute-long model call could end.
    await expect.poll(() => lines.find((line) => line.includes("did not commit")), { timeout: 10_000 }).toBeDefined();
    expect(Date.now() - started).toBeLessThan(30_000);
    for (const table of ["runs", "messages", "run_events", "emissions", "run_steps", "model_calls"]) {
      const { rows } = await h.db().query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`);
      expect({ table, rows: rows[0]?.n }).toEqual({ table, rows: 0 });
    }

    // The one worker is free again: the next message is answered.
    const next = await ingress.submitMessage({ agentId: QUICK.id, conversationId: "c-next", actor: { id: "ana" }, messageId: "m-next", text: "hello", connector: "test" });
    await expect
      .poll(async () => (await h.db().query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [next.runId])).rows[0]?.status, { timeout: 10_000 })
      .toBe("succeeded");
  }, 60_000);

  it("starts the model call for a handed run and commits its step after the admission", async () => {
    const ingress = grpcClient(IngressService, h.keel().url, h.keel().tokens.connector);
    const { runId } = await ingress.submitMessage({ agentId: QUICK.id, conversationId: "c-ok", actor: { id: "bo" }, messageId: "m-ok", text: "hi there", connector: "test" });
    await expect
      .poll(async () => (await h.db().query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status, { timeout: 10_000 })
      .toBe("succeeded");
    const { rows } = await h.db().query<{ kind: string; summary: string }>("SELECT kind, summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [runId]);
    // Claimed in the admission itself (epoch 1, the reserved worker), not later by claimNext.
    expect(rows[0]?.kind).toBe("created");
    expect(rows[1]?.summary).toMatch(/^claimed by worker-.* at epoch 1$/);
    expect(rows.length).toBeGreaterThan(2);
  }, 60_000);
});

/** One root run at a time, each taking a while to answer. */
const ONE_AT_A_TIME: AgentSpec = {
  ...DEMO_AGENT,
  id: "one-at-a-time",
  maxConcurrentRootRuns: 1,
  interrupt: { ...DEMO_AGENT.interrupt, coalesceWindowMs: 0 },
  models: {
    ...DEMO_AGENT.models,
    primary: { ...DEMO_AGENT.models.primary, scriptedTurns: [{ replyText: "done", toolCalls: [], delayMs: 3_000, inputTokens: 1, outputTokens: 1 }] },
  },
};

describe("admission starts the worker before the claim is written", () => {
  // Two workers: while one serves the first run, the other is idle and gets reserved for the second.
  const h = keelWithLog({ workers: 2, agents: [ONE_AT_A_TIME] }, "debug");
  const lines = h.lines;

  const statusOf = async (runId: string) => (await h.db().query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status;

  it("aborts the worker's model call when a ceiling queues the run instead, starts no more early while the agent is at it, and serves every run later", async () => {
    const ingress = grpcClient(IngressService, h.keel().url, h.keel().tokens.connector);
    const first = await ingress.submitMessage({ agentId: ONE_AT_A_TIME.id, conversationId: "c-first", actor: { id: "ana" }, messageId: "m-first", text: "first", connector: "test" });
    await expect.poll(() => statusOf(first.runId), { timeout: 10_000 }).toBe("running");

    // The agent's ceiling is taken: the second run is written queued, and the idle worker that
    // admission had already started on it lets it go.
    const second = await ingress.submitMessage({ agentId: ONE_AT_A_TIME.id, conversationId: "c-second", actor: { id: "bo" }, messageId: "m-second", text: "second", connector: "test" });
    await expect.poll(() => lines.find((line) => line.includes("queued behind a ceiling instead of started")), { timeout: 10_000 }).toBeDefined();
    expect(lines.find((line) => line.includes(second.runId) && line.includes("queued behind a ceiling instead of started"))).toBeDefined();
    expect(await statusOf(second.runId)).toBe("queued");
    expect(lines.filter((line) => line.includes("did not commit"))).toEqual([]);

    // The agent met its ceiling: the next message is not started early again (no second call to
    // abort), and waits queued too. (The worker that let the run go is idle again by then.)
    await new Promise((resolve) => setTimeout(resolve, 300));
    const third = await ingress.submitMessage({ agentId: ONE_AT_A_TIME.id, conversationId: "c-third", actor: { id: "cy" }, messageId: "m-third", text: "third", connector: "test" });
    expect(await statusOf(third.runId)).toBe("queued");
    // Time for an aborted early start to be logged, were there one; the ceiling is still held.
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await statusOf(first.runId)).toBe("running");
    expect(lines.filter((line) => line.includes("queued behind a ceiling instead of started"))).toHaveLength(1);

    // Once the first run is done, the others are claimed the ordinary way, one at a time, and each answered once.
    for (const { runId } of [first, second, third]) {
      await expect.poll(() => statusOf(runId), { timeout: 15_000 }).toBe("succeeded");
      const { rows: calls } = await h.db().query<{ n: number }>("SELECT count(*)::int AS n FROM model_calls WHERE run_id = $1 AND step_id IS NOT NULL", [runId]);
      expect(calls[0]?.n).toBe(1);
      const { rows: reply } = await h.db().query<{ final_reply: string }>("SELECT final_reply FROM runs WHERE id = $1", [runId]);
      expect(reply[0]?.final_reply).toBe("done");
    }
  }, 90_000);
});

describe("a worker a run admission started goes back to waiting, not to the queue", () => {
  // Claim queries this Keel's workers made; idle polls are pushed out past the test.
  let claims = 0;
  const h = keelWithLog(
    {
      workers: 2,
      agents: [QUICK],
      env: { KEEL_IDLE_POLL_MS: "60000" },
      wrapRunnerDeps: (deps) => ({ ...deps, store: { ...deps.store, claimNext: (workerId, leaseMs) => (claims++, deps.store.claimNext(workerId, leaseMs)) } }),
    },
    "warn",
  );

  it("makes no claim query after a handed run ends with nothing queued, and still serves a run queued meanwhile", async () => {
    const ingress = grpcClient(IngressService, h.keel().url, h.keel().tokens.connector);
    const settled = (runId: string) =>
      expect.poll(async () => (await h.db().query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status, { timeout: 10_000 }).toBe("succeeded");
    // Each worker claimed once as it started, found nothing and went idle.
    await expect.poll(() => claims, { timeout: 10_000 }).toBe(2);
    for (let i = 0; i < 5; i++) {
      const { runId } = await ingress.submitMessage({ agentId: QUICK.id, conversationId: `c-wait-${i}`, actor: { id: "cy" }, messageId: `m-wait-${i}`, text: "hi", connector: "test" });
      await settled(runId);
    }
    expect(claims).toBe(2);
    // A run queued elsewhere (written here, as another replica's admission would) is announced, and a waiting worker claims it.
    const db = h.db();
    const [runId, conversationId, messageId] = [randomUUID(), randomUUID(), randomUUID()];
    await db.query("BEGIN");
    await db.query("INSERT INTO actors (id) VALUES ('cy') ON CONFLICT DO NOTHING");
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, 'c-wait-queued', 'test')", [conversationId, QUICK.id]);
    await db.query("INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($1, $2, 'm-wait-q', 'cy', 'hi', $3)", [messageId, conversationId, runId]);
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage)
       VALUES ($1, $2, $3, 'test', 'queued', 'cy', 'm-wait-q', $4::jsonb, '{}'::jsonb)`,
      [runId, QUICK.id, conversationId, JSON.stringify(QUICK.budget)],
    );
    await db.query("INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) VALUES ($1, $2, 'cy', 'm-wait-q')", [runId, messageId]);
    await db.query("SELECT pg_notify('keel_runs', $1)", [runId]);
    await db.query("COMMIT");
    await settled(runId);
    // The claim that took it, and one after it ended: a run from the queue may have more behind it.
    await expect.poll(() => claims, { timeout: 10_000 }).toBe(4);
  }, 60_000);
});
