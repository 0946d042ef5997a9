// Cancelling a root run while its WorkGraph runs (issue #14 item 8): the parked root stops at once,
// every child is asked to stop and stops at its next safe point, the graph ends cancelled, and
// nobody in the thread hears a reply. Real PostgreSQL, real workers, gRPC clients.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { until } from "./support/until.js";
import { graphRootAgent, NODE_SLICE } from "./support/graph-children.js";

const PROPOSAL = {
  nodes: [
    { key: "left", kind: "agent_loop", objective: "Do the left half", budget: NODE_SLICE },
    { key: "right", kind: "agent_loop", objective: "Do the right half", budget: NODE_SLICE },
    { key: "both", kind: "join", objective: "Put them together" },
  ],
  edges: [
    { from: "left", to: "both" },
    { from: "right", to: "both" },
  ],
};
const base = scriptedAgent("graph-cancel", [turn("", [toolCall("keel.propose_work_graph.v1", PROPOSAL)]), turn("never said")]);
const agent = graphRootAgent(base);

/** Children's model calls hold until the test lets them go. */
let started = 0;
let release: () => void = () => {};
const released = new Promise<void>((resolve) => (release = resolve));

function holdChildren(deps: RunnerDeps): RunnerDeps {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    async complete(request) {
      if (!request.messages.some((m) => m.role === "user" && m.content.startsWith("You are doing one part of a larger task"))) return scripted.complete(request);
      started += 1;
      await released;
      return { text: "half done", toolCalls: [], usage: { inputTokens: 10, outputTokens: 2 }, finishReason: "stop" };
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
}

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 3, agents: [agent], wrapRunnerDeps: holdChildren, env: { KEEL_IDLE_POLL_MS: "250" } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  release();
  await db?.end();
  await keel?.stop();
});

describe("cancelling a root run mid-graph (issue 14)", () => {
  it("stops the root, asks every child to stop, and ends the graph cancelled without a reply", async () => {
    const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
    const { runId: rootId } = await ingress.submitMessage({ agentId: agent.id, conversationId: "cancel", actor: { id: "alice" }, messageId: "m-cancel", text: "Do both halves", connector: "graph-test" });
    await until("both children's model calls", async () => (started >= 2 ? true : undefined));

    const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
    await runs.cancelRun({ runId: rootId, actor: { id: "ops" }, reason: "changed my mind" });
    const children = await until("both children asked to stop", async () => {
      const { rows } = await db.query<{ id: string; cancel_requested_by_actor_id: string | null }>(
        "SELECT id, cancel_requested_by_actor_id FROM runs WHERE parent_run_id = $1",
        [rootId],
      );
      return rows.length === 2 && rows.every((r) => r.cancel_requested_by_actor_id !== null) ? rows : undefined;
    });
    release();

    await until("both children cancelled", async () => {
      const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE parent_run_id = $1", [rootId]);
      return rows.every((r) => r.status === "cancelled") ? true : undefined;
    });
    const graphStatus = await until("the graph to end", async () => {
      const { rows } = await db.query<{ status: string }>("SELECT status FROM work_graphs WHERE root_run_id = $1", [rootId]);
      return rows[0]?.status === "running" ? undefined : rows[0]?.status;
    });
    expect(graphStatus).toBe("cancelled");
    const { rows: root } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [rootId]);
    expect(root[0]?.status).toBe("cancelled");
    const { rows: nodes } = await db.query<{ key: string; status: string }>(
      "SELECT n.key, n.status FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1 ORDER BY n.ordinal",
      [rootId],
    );
    expect(nodes.map((n) => n.key)).toEqual(["left", "right", "both"]);
    expect(nodes.map((n) => n.status)).toEqual(["cancelled", "cancelled", "cancelled"]);

    const { rows: replies } = await db.query("SELECT id FROM emissions WHERE kind = 'reply' AND run_id = ANY($1::uuid[])", [[rootId, ...children.map((c) => c.id)]]);
    expect(replies).toHaveLength(0);
  });
});
