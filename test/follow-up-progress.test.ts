// A follow-up run's context carries the conversation's three most recent progress records, as
// the issue asks: checked on the model request the ledger stored for the follow-up's call, with
// a real server, real PostgreSQL and a scripted model slow enough for several notices. The
// follow-up starts at once on the idle worker, so its notices come with admission's read of the
// conversation (the worker reads them itself only for a run it claims from the queue).
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn as turn } from "../control-plane/src/fixtures/scripted-model.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const agent: AgentSpec = {
  ...DEMO_AGENT,
  id: "follow-up-progress",
  models: {
    primary: scriptedModel([turn("Done: {{message}}", [], { delayMs: 3_000 })]),
    fast: scriptedModel([turn(JSON.stringify({ duration: "default", shape: "loop", ack_text: null }), [], { inputTokens: 1, outputTokens: 1 })]),
    decision: scriptedModel([turn("independent")]),
  },
  interrupt: { coalesceWindowMs: 0, scope: "thread_scoped", maxSupersessions: 3, supersessionCeilingMs: 120_000 },
  progress: { firstAfterMs: 100, everyMs: 200, minGapMs: 100 },
};

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 1, agents: [agent], progress: { tickMs: 20 } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
}, 60_000);

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

async function settled(runId: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId]);
    if (rows[0]?.status === "succeeded") return;
    if (Date.now() > deadline) throw new Error(`run ${runId} did not succeed (status ${rows[0]?.status ?? "missing"})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

interface StoredMessage {
  role: string;
  content: string;
}

/** The messages of a run's first primary model call, as the ledger stored its request. */
async function storedMessages(runId: string): Promise<StoredMessage[]> {
  const { rows } = await db.query<{ request: { messages?: StoredMessage[] } }>(
    "SELECT request FROM model_calls WHERE run_id = $1 AND role = 'primary' ORDER BY created_at LIMIT 1",
    [runId],
  );
  const messages = rows[0]?.request.messages;
  if (messages === undefined) throw new Error(`no stored primary request for run ${runId}: ${JSON.stringify(rows[0])}`);
  return messages;
}

describe("a follow-up run's context", () => {
  it("includes the three most recent progress records of the earlier run, labelled as progress", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const submit = (messageId: string, text: string) =>
      ingress.submitMessage({ agentId: agent.id, conversationId: "fu-progress", actor: { id: "alice" }, messageId, text, connector: "test" });

    const first = await submit("m1", "refactor the parser");
    await settled(first.runId);
    const { rows: notices } = await db.query<{ text: string }>("SELECT text FROM progress_events WHERE run_id = $1 ORDER BY created_at, seq", [first.runId]);
    // Enough notices that only the latest three can be the ones shown.
    expect(notices.length).toBeGreaterThanOrEqual(4);
    expect((await storedMessages(first.runId)).some((m) => m.content.includes("Progress records"))).toBe(false);

    const second = await submit("m2", "and the tokenizer?");
    expect(second.runId).not.toBe(first.runId);
    await settled(second.runId);
    const messages = await storedMessages(second.runId);
    const block = messages.filter((m) => m.content.startsWith("[keel] Progress records"));
    expect(block, JSON.stringify(messages)).toHaveLength(1);
    expect(block[0]?.role).toBe("user");
    const shown = (block[0]?.content ?? "").split("\n").slice(1).map((line) => line.replace(/^- \[progress [^\]]+\] /, ""));
    expect(shown).toEqual(notices.slice(-3).map((n) => n.text));
    // Never passed off as the agent's own replies.
    const assistantTexts = messages.filter((m) => m.role === "assistant").map((m) => m.content);
    for (const notice of notices) expect(assistantTexts).not.toContain(notice.text);
    expect(messages.at(-1)).toMatchObject({ role: "user", content: "and the tokenizer?" });
  }, 120_000);
});
