// A control plane stopped mid-graph (issue #14 item 8): the scheduler's state is the ledger, so a
// new process on the same database finishes the graph. The branch that had completed is not run
// again, the interrupted branch's child run is claimed again (same attempt), and the root replies
// once. On the way, a child that asks for a tool beyond its node's (a graph of its own) is refused.
// Real PostgreSQL, real workers, gRPC clients.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { WorkNodeStatus } from "../gen/keel/v1/work_graph_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { grpcClient } from "./support/clients.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { until } from "./support/until.js";
import { graphRootAgent, NODE_SLICE } from "./support/graph-children.js";

const PROPOSAL = {
  nodes: [
    { key: "quick", kind: "agent_loop", objective: "Do the quick part", budget: NODE_SLICE },
    { key: "slow", kind: "agent_loop", objective: "Do the slow part", budget: NODE_SLICE },
    { key: "both", kind: "join", objective: "Put them together" },
  ],
  edges: [
    { from: "quick", to: "both" },
    { from: "slow", to: "both" },
  ],
};
const FINAL = "Both parts are done.";
const base = scriptedAgent("graph-restart", [turn("", [toolCall("keel.propose_work_graph.v1", PROPOSAL)]), turn(FINAL)]);
const agent = graphRootAgent(base);

const NODE = /^You are doing one part of a larger task: node "([^"]+)"/;
/** Model calls per node key, across both processes. */
const calls = new Map<string, number>();
/** Until set, the slow branch's call waits (and ends with its worker when the process stops). */
let slowReleased = false;

function branches(deps: RunnerDeps): RunnerDeps {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    async complete(request) {
      const input = request.messages.find((m) => m.role === "user" && NODE.test(m.content))?.content;
      const key = input === undefined ? undefined : NODE.exec(input)?.[1];
      if (key === undefined) return scripted.complete(request);
      calls.set(key, (calls.get(key) ?? 0) + 1);
      // The quick branch first reaches for more than it was given: a graph of its own.
      if (key === "quick" && !request.messages.some((m) => m.role === "assistant")) {
        const call = { id: "recurse", name: "keel.propose_work_graph.v1", argumentsJson: JSON.stringify(PROPOSAL) };
        return { text: "", toolCalls: [call], usage: { inputTokens: 10, outputTokens: 2 }, finishReason: "tool_calls" };
      }
      if (key === "slow" && !slowReleased) {
        await new Promise((_, reject) => {
          const stop = () => reject(request.signal.reason instanceof Error ? request.signal.reason : new Error("stopped"));
          if (request.signal.aborted) stop();
          request.signal.addEventListener("abort", stop, { once: true });
        });
      }
      return { text: `the ${key} part`, toolCalls: [], usage: { inputTokens: 10, outputTokens: 2 }, finishReason: "stop" };
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
}

let databaseUrl: string;
let first: TestKeel | undefined;
let second: TestKeel | undefined;
let db: pg.Client;

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  first = await startTestKeel({ databaseUrl, workers: 3, agents: [agent], wrapRunnerDeps: branches, env: { KEEL_IDLE_POLL_MS: "250", KEEL_LEASE_MS: "2000" } });
  db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
});

afterAll(async () => {
  slowReleased = true;
  await db?.end();
  await first?.stop();
  await second?.stop();
});

describe("a control plane stopped mid-graph (issue 14)", () => {
  it("is finished by the next one: the done branch is not run again, the root replies once", async () => {
    const ingress = grpcClient(IngressService, first!.url, first!.tokens.connector);
    const { runId: rootId } = await ingress.submitMessage({ agentId: agent.id, conversationId: "restart", actor: { id: "alice" }, messageId: "m-restart", text: "Do both parts", connector: "graph-test" });
    await until("the quick branch done and the slow one in its call", async () => {
      const { rows } = await db.query<{ status: string }>(
        "SELECT n.status FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1 AND n.key = 'quick'",
        [rootId],
      );
      return rows[0]?.status === "succeeded" && (calls.get("slow") ?? 0) >= 1 ? true : undefined;
    });
    await first!.stop();
    first = undefined;

    slowReleased = true;
    second = await startTestKeel({ databaseUrl, workers: 3, agents: [agent], wrapRunnerDeps: branches, env: { KEEL_IDLE_POLL_MS: "250", KEEL_LEASE_MS: "2000" } });
    const runs = grpcClient(RunService, second.url, second.tokens.operator);
    const status = await until("the root to settle", async () => {
      const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [rootId]);
      const now = rows[0]?.status;
      return now === "succeeded" || now === "failed" || now === "cancelled" || now === "budget_exhausted" ? now : undefined;
    });
    expect(status).toBe("succeeded");

    expect(calls.get("quick")).toBe(2);
    expect(calls.get("slow")).toBe(2);
    const { graph } = await runs.getWorkGraph({ runId: rootId });
    expect(graph?.nodes.map((n) => [n.key, n.status, n.attempts.length])).toEqual([
      ["quick", WorkNodeStatus.SUCCEEDED, 1],
      ["slow", WorkNodeStatus.SUCCEEDED, 1],
      ["both", WorkNodeStatus.SUCCEEDED, 0],
    ]);
    const { rows: replies } = await db.query<{ text: string }>("SELECT text FROM emissions WHERE kind = 'reply' AND run_id = $1", [rootId]);
    expect(replies).toEqual([{ text: FINAL }]);
    const { rows: children } = await db.query("SELECT id FROM runs WHERE parent_run_id = $1", [rootId]);
    expect(children).toHaveLength(2);

    // A child is offered only its node's tools: its attempt at a graph of its own was refused.
    const { rows: refused } = await db.query<{ status: string; refusal_reason: string }>(
      "SELECT t.status, t.refusal_reason FROM tool_invocations t JOIN runs r ON r.id = t.run_id WHERE r.parent_run_id = $1",
      [rootId],
    );
    expect(refused.map((r) => r.status)).toEqual(["refused"]);
    expect(refused[0]!.refusal_reason).toContain('there is no tool "keel.propose_work_graph.v1" in this run');
  });
});
