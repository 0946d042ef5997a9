// A worker carries a run's side usage (fast- and decision-model calls made beside the loop) from
// its last commit into the next model call's budget check instead of reading it before every
// call. A side call recorded while a read runs must still count at the very next model call:
// the ledger signals it like a cancellation (keel_run_control), and the held read's commit
// reads the control state again.
import { randomUUID } from "node:crypto";
import pg from "pg";
import { pino } from "pino";
import { z } from "zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { withBudgetDefaults } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedTurn as turn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const usage = { inputTokens: 10, outputTokens: 1 };
const agent = scriptedAgent(
  "side-usage",
  [turn("", [toolCall("test.gate.v1", {})], usage), turn("", [toolCall("test.gate.v1", {})], usage), turn("", [toolCall("test.gate.v1", {})], usage), turn("done", [], usage)],
  { tools: toolGrants(["test.gate.v1"]), budget: withBudgetDefaults({ maxInputTokens: 1_000 }) },
);

let url: string;
let app: KeelApp;
let db: pg.Client;
/** Resolves when the worker's own control-change listener has heard about `watched`. */
let watched = "";
let heard: () => void = () => {};
/** What the gated read does while it runs (the first call only). */
let duringFirstRead: (() => Promise<void>) | undefined;

const gate = defineTool<Record<string, never>>({
  name: "test.gate",
  version: 1,
  description: "A read that runs a test's action before it returns.",
  parameters: z.object({}),
  effect: "read",
  async execute() {
    const action = duringFirstRead;
    duringFirstRead = undefined;
    await action?.();
    return { ok: true, text: "read" };
  },
});

/** The worker's listener runs first; the test hears the same notification right after it. */
function observeControlChanges(deps: RunnerDeps): RunnerDeps {
  const controlChanges = deps.controlChanges;
  if (controlChanges === undefined) throw new Error("the app wires no control-change feed");
  return {
    ...deps,
    controlChanges: (listener) =>
      controlChanges((runId) => {
        listener(runId);
        if (runId === watched) heard();
      }),
  };
}

beforeAll(async () => {
  url = await createTestDatabase();
  const env = { DATABASE_URL: url, KEEL_WORKERS: "1", KEEL_DB_POOL_MAX: "4", KEEL_IDLE_POLL_MS: "200", KEEL_READ_FLUSH_MS: "10000" };
  app = await buildApp(loadConfig(env), env, {
    log: pino({ level: process.env["KEEL_TEST_LOG"] ?? "silent" }),
    tools: [gate],
    wrapRunnerDeps: observeControlChanges,
  });
  await app.agents.put(agent);
  app.startWorkers();
  db = new pg.Client({ connectionString: url });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await app?.stop();
});

/** A queued run, as admission would store it (SQL keeps ingress and its triage out of this test). */
async function submit(runId: string): Promise<void> {
  const [conversationId, messageId, key] = [randomUUID(), randomUUID(), randomUUID()];
  await db.query("BEGIN");
  await db.query("INSERT INTO actors (id) VALUES ('alice') ON CONFLICT DO NOTHING");
  await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [conversationId, agent.id, key]);
  await db.query("INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($1, $2, $3, 'alice', 'hi', $4)", [messageId, conversationId, key, runId]);
  await db.query(
    `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage)
     VALUES ($1, $2, $3, 'test', 'queued', 'alice', $4, $5::jsonb, '{}'::jsonb)`,
    [runId, agent.id, conversationId, key, JSON.stringify(agent.budget)],
  );
  await db.query("INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) VALUES ($1, $2, 'alice', $3)", [runId, messageId, key]);
  await db.query("SELECT pg_notify('keel_runs', $1)", [runId]);
  await db.query("COMMIT");
}

async function settledRun(runId: string): Promise<{ status: string; exhausted_dimension: string | null; steps: number }> {
  for (let i = 0; i < 600; i++) {
    const { rows } = await db.query<{ status: string; exhausted_dimension: string | null; steps: number }>(
      "SELECT status, exhausted_dimension, step_count AS steps FROM runs WHERE id = $1",
      [runId],
    );
    const row = rows[0];
    if (row !== undefined && ["succeeded", "failed", "cancelled", "budget_exhausted"].includes(row.status)) return row;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`run ${runId} did not settle`);
}

describe("side usage carried from the last commit (issue 16)", () => {
  it("a side call recorded while a read runs counts at the next model call", async () => {
    const runId = randomUUID();
    watched = runId;
    const signalled = new Promise<void>((resolve) => (heard = resolve));
    duringFirstRead = async () => {
      // What recordSideCall adds for a decision call far over the input-token budget.
      await db.query(
        `UPDATE runs SET side_usage = jsonb_build_object('modelCalls', 1, 'inputTokens', 5000, 'outputTokens', 1, 'costMicroUsd', 0) WHERE id = $1`,
        [runId],
      );
      // The worker has heard it before the read returns: its held result is committed with a
      // fresh control state. Bounded, so a feed that never signals fails on the step count.
      await Promise.race([signalled, new Promise((resolve) => setTimeout(resolve, 15_000))]);
    };
    await submit(runId);
    const run = await settledRun(runId);
    expect(run.status).toBe("budget_exhausted");
    expect(run.exhausted_dimension).toBe("input_tokens");
    // The second model call's check counted the side call: no third call was made.
    expect(run.steps).toBe(2);
    const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM model_calls WHERE run_id = $1 AND role = 'primary'", [runId]);
    expect(rows[0]?.n).toBe(2);
  });
});
