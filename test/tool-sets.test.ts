// A model request's tool list is stored once (ledger/tool-sets.ts): every run of an agent names
// the same stored list, and every reader gets the whole request back, as before.
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools } from "./support/test-tools.js";
import { createSqlPool, registeredStatements, type Sql } from "../control-plane/src/ledger/sql.js";
import { createToolSets } from "../control-plane/src/ledger/tool-sets.js";

interface WholeRequest {
  readonly messages: { readonly role: string; readonly content?: string }[];
  readonly tools: { readonly name: string }[];
}

describe("tool lists stored once", () => {
  let keel: TestKeel;
  let db: pg.Client;
  beforeAll(async () => {
    const effectsDir = await mkdtemp(path.join(tmpdir(), "keel-tool-sets-"));
    keel = await startTestKeel({
      tools: createTestTools({ effectsDir }),
      agents: [
        scriptedAgent("echoer", [turn("", [{ toolName: "test.echo.v1", argumentsJson: '{"text":"hi"}' }]), turn("done")], {
          tools: toolGrants(["test.echo.v1", "test.read_path.v1"]),
        }),
      ],
    });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });

  async function settledRun(conversationId: string): Promise<string> {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { runId } = await ingress.submitMessage({ agentId: "echoer", conversationId, actor: { id: "alice" }, messageId: `m-${conversationId}`, text: "echo hi", connector: "tool-sets-test" });
    for (let i = 0; i < 200; i++) {
      const { run } = await runs.getRun({ runId });
      if (run?.status === RunStatus.SUCCEEDED) return runId;
      if (run !== undefined && run.status !== RunStatus.QUEUED && run.status !== RunStatus.RUNNING && run.status !== RunStatus.AWAITING_TOOL) {
        throw new Error(`run ${runId} ended ${RunStatus[run.status]}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`run ${runId} did not succeed`);
  }

  const requestsOf = async (runId: string) =>
    (await db.query<{ request: Record<string, unknown> }>("SELECT request FROM model_calls WHERE run_id = $1 ORDER BY created_at", [runId])).rows.map((row) => row.request);

  it("stores two runs' tool list once, each first request naming it, and reads every request back whole", async () => {
    const [first, second] = [await settledRun("c-1"), await settledRun("c-2")];
    const { rows: sets } = await db.query<{ digest: string; tools: { name: string }[] }>("SELECT digest, tools FROM model_tool_sets");
    expect(sets).toHaveLength(1);
    expect(sets[0]!.tools.map((tool) => tool.name)).toEqual(expect.arrayContaining(["test.echo.v1", "test.read_path.v1"]));
    for (const runId of [first, second]) {
      const [whole, delta] = await requestsOf(runId);
      expect(whole).toMatchObject({ toolSet: sets[0]!.digest });
      expect(whole).not.toHaveProperty("tools");
      // The run's second call has the same list: its delta names none.
      expect(typeof delta?.["base"]).toBe("string");
      expect(delta).not.toHaveProperty("tools");
      expect(delta).not.toHaveProperty("toolSet");
    }

    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { steps } = await runs.listRunSteps({ runId: second });
    const requests = steps.map((step) => JSON.parse(step.modelCall!.requestJson) as WholeRequest);
    expect(requests).toHaveLength(2);
    for (const request of requests) {
      expect(request.tools).toEqual(sets[0]!.tools);
      expect(request).not.toHaveProperty("toolSet");
    }
    expect(requests[1]!.messages.at(-1)).toMatchObject({ role: "tool", content: "echo: hi" });
  });

  it("counts a step's tool list in the size that bounds a page of steps, as it is read back whole", async () => {
    const runId = await settledRun("c-size");
    const steps = registeredStatements().find((s) => s.name === "keel_run_query_steps")!;
    const { rows } = await db.query<{ index: number; detail_bytes: number }>({
      text: steps.text,
      values: steps.bind({ runId, fromIndex: 0, limit: 10 } as never),
    });
    const { rows: stored } = await db.query<{ request: number; response: number; tools: number }>(
      `SELECT pg_column_size(m.request) AS request, coalesce(octet_length(m.response_text), 0) AS response, pg_column_size(t.tools) AS tools
       FROM model_calls m JOIN run_steps s ON s.id = m.step_id JOIN model_tool_sets t ON t.digest = m.request ->> 'toolSet'
       WHERE m.run_id = $1 AND s.index = 0`,
      [runId],
    );
    const first = stored[0]!;
    expect(first.tools).toBeGreaterThan(first.request);
    expect(rows.find((row) => Number(row.index) === 0)?.detail_bytes).toBeGreaterThanOrEqual(first.request + first.response + first.tools);
  });

  it("reads a request stored with its list inline, as before tool sets, the same way", async () => {
    const runId = await settledRun("c-3");
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const before = (await runs.listRunSteps({ runId })).steps.map((step) => JSON.parse(step.modelCall!.requestJson) as WholeRequest);
    await db.query(
      `UPDATE run_steps s SET call_request = (s.call_request - 'toolSet') || jsonb_build_object('tools', t.tools)
       FROM model_tool_sets t WHERE s.run_id = $1 AND t.digest = s.call_request ->> 'toolSet'`,
      [runId],
    );
    const [inline] = await requestsOf(runId);
    expect(inline).toHaveProperty("tools");
    expect(inline).not.toHaveProperty("toolSet");
    const after = (await runs.listRunSteps({ runId })).steps.map((step) => JSON.parse(step.modelCall!.requestJson) as WholeRequest);
    expect(after).toEqual(before);
    expect(after[0]!.tools.length).toBeGreaterThan(0);
  });

  it("inserts a list that several commits meet at once once, and a list it has stored not again", async () => {
    const pool = createSqlPool({ url: keel.databaseUrl, max: 4 });
    try {
      let inserts = 0;
      const counting: Sql = { ...pool, run: (statement, params) => ((inserts += statement.name === "keel_tool_set_insert" ? 1 : 0), pool.run(statement, params)) };
      const toolSets = createToolSets(counting);
      const tools = [{ name: "test.concurrent.v1", description: "seen by five commits at once", parametersJsonSchema: { type: "object" } }];
      const stored = await Promise.all(Array.from({ length: 5 }, (_, i) => toolSets.requestJson({ messages: [{ role: "user", content: `m${i}` }], tools })));
      expect(inserts).toBe(1);
      expect(new Set(stored.map((json) => (JSON.parse(json) as { toolSet: string }).toolSet)).size).toBe(1);
      await toolSets.requestJson({ messages: [], tools });
      expect(inserts).toBe(1);
      // No tools, nothing to store: the request goes as it is.
      expect(await toolSets.requestJson({ messages: [{ role: "user", content: "x" }], tools: [] })).toBe(JSON.stringify({ messages: [{ role: "user", content: "x" }], tools: [] }));
      const { rows } = await db.query<{ tools: unknown }>("SELECT tools FROM model_tool_sets WHERE digest = $1", [(JSON.parse(stored[0]!) as { toolSet: string }).toolSet]);
      expect(rows.map((row) => row.tools)).toEqual([tools]);
    } finally {
      await pool.close();
    }
  });

  it("names a list by its content whether its elements are objects seen before or new ones", async () => {
    const pool = createSqlPool({ url: keel.databaseUrl, max: 2 });
    try {
      const toolSets = createToolSets(pool);
      const digest = async (tools: readonly unknown[]) => (JSON.parse(await toolSets.requestJson({ messages: [], tools })) as { toolSet: string }).toolSet;
      const spec = { name: "test.same.v1", description: "one spec object", parametersJsonSchema: { type: "object" } };
      const other = { name: "test.other.v1", description: "another", parametersJsonSchema: { type: "object" } };
      const first = await digest([spec, other]);
      // The same objects in a new array (as each run's catalog gives them), and equal copies.
      expect(await digest([spec, other])).toBe(first);
      expect(await digest([structuredClone(spec), structuredClone(other)])).toBe(first);
      // One element a different object with different content, or the order changed: another list.
      const changed = await digest([spec, { ...other, description: "changed" }]);
      expect(changed).not.toBe(first);
      expect(await digest([other, spec])).not.toBe(first);
      const { rows } = await db.query<{ tools: { description: string }[] }>("SELECT tools FROM model_tool_sets WHERE digest = $1", [changed]);
      expect(rows[0]?.tools[1]?.description).toBe("changed");
    } finally {
      await pool.close();
    }
  });
});
