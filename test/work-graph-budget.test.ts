// One budget for a whole WorkGraph (issue #14): six agent_loop nodes, each with a slice of two
// model calls, under a root whose budget fits exactly its own two calls and the six slices. Every
// child spends its whole slice (a tool call the node cannot make, then an answer), and one keeps
// calling past it: the slice stops it, so the root still has the call it needs to reply. Real
// PostgreSQL, real workers, gRPC clients.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { DEFAULT_GRAPH_CEILINGS, withBudgetDefaults, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedModel, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const PROPOSE = "keel.propose_work_graph.v1";
const SLICE_CALLS = 2;
const SLICE = {
  wall_clock_ms: 120_000,
  iterations: 4,
  model_calls: SLICE_CALLS,
  tool_calls: 2,
  input_tokens: 50_000,
  output_tokens: 5_000,
  output_bytes: 100_000,
  cost_micro_usd: 10,
};
const KEYS = ["a", "b", "c", "d", "e", "f"] as const;
/** The node that never stops asking for another tool call. */
const GREEDY = "e";
/** Two waves under a parallelism of three: d, e and f each wait on one of the first three. */
const SIX = {
  nodes: KEYS.map((key) => ({ key, kind: "agent_loop", objective: `Work out part ${key} of the answer`, budget: SLICE })),
  edges: [
    { from: "a", to: "d" },
    { from: "b", to: "e" },
    { from: "c", to: "f" },
  ],
};
/** The root's own calls: the proposal and the reply after the graph. */
const ROOT_CALLS = 2;
const ROOT_BUDGET = ROOT_CALLS + KEYS.length * SLICE_CALLS;
const FINAL_REPLY = "Five parts are done and one ran out of its budget; here is what there is.";
const QUIET = scriptedModel([turn("")]);
const base = scriptedAgent("graph-budget", [turn("", [toolCall(PROPOSE, SIX)]), turn(FINAL_REPLY)]);
const agent: AgentSpec = {
  ...base,
  models: { primary: base.models.primary, fast: QUIET, decision: QUIET },
  graph: { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 6, maxDepth: 3, maxParallelism: 3, maxReplans: 0 },
  budget: withBudgetDefaults({ maxModelCalls: ROOT_BUDGET }),
};

const CHILD_MARK = /^You are doing one part of a larger task: node "([^"]+)"/;
const childCalls = new Map<string, number>();

/**
 * The greedy node's slice runs out only once every node's child has made its first call. A
 * failed node stops the graph from starting more (domain/work-graph-schedule.ts), so without
 * this a slow start of f (after c) would leave it cancelled with no child run.
 */
async function everyNodeStarted(): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (KEYS.some((key) => !childCalls.has(key)) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
}

/** Children: a call for a tool the node lacks (refused, the loop goes on), then an answer; the greedy one never answers. */
function childModels(deps: RunnerDeps): RunnerDeps {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    async complete(request: ModelRequest) {
      const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content ?? "";
      const key = CHILD_MARK.exec(input)?.[1];
      if (key === undefined) return scripted.complete(request);
      const calls = (childCalls.get(key) ?? 0) + 1;
      childCalls.set(key, calls);
      const usage = { inputTokens: 100, outputTokens: 10 };
      if (key === GREEDY && calls === SLICE_CALLS) await everyNodeStarted();
      if (calls === 1 || key === GREEDY) {
        const toolCalls = [{ id: `call-${key}-${calls}`, name: "test.not_granted.v1", argumentsJson: "{}" }];
        return { text: "", toolCalls, usage, finishReason: "tool_calls" as const };
      }
      return { text: `result of ${key}`, toolCalls: [], usage, finishReason: "stop" as const };
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
}

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 5, agents: [agent], wrapRunnerDeps: childModels, env: { KEEL_IDLE_POLL_MS: "250" } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

async function settled(runId: string): Promise<RunStatus> {
  const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
  for (let i = 0; i < 1_200; i++) {
    const { run } = await runs.getRun({ runId });
    if (run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)) return run.status;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`run ${runId} did not settle`);
}

describe("WorkGraph budget slices (issue 14)", () => {
  it("debits six nodes' slices so their spend and the root's never pass the root budget", async () => {
    const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
    const { runId: rootId } = await ingress.submitMessage({
      agentId: agent.id,
      conversationId: "budget",
      actor: { id: "alice" },
      messageId: "m-budget",
      text: "Answer in six parts",
      connector: "graph-test",
    });
    expect(RunStatus[await settled(rootId)]).toBe("SUCCEEDED");

    const { rows: children } = await db.query<{ id: string; status: string; exhausted_dimension: string | null; usage: Record<string, number> }>(
      "SELECT id, status, exhausted_dimension, usage FROM runs WHERE parent_run_id = $1",
      [rootId],
    );
    expect(children).toHaveLength(KEYS.length);
    const { rows: nodes } = await db.query<{ key: string; child_run_id: string }>(
      `SELECT n.key, a.child_run_id FROM work_nodes n JOIN work_node_attempts a ON a.node_id = n.id
       JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1`,
      [rootId],
    );
    const childOf = (key: string) => children.find((c) => c.id === nodes.find((n) => n.key === key)?.child_run_id);
    // The greedy node is stopped at its slice; the others spend exactly theirs and succeed.
    expect(childOf(GREEDY)).toMatchObject({ status: "budget_exhausted", exhausted_dimension: "model_calls" });
    expect(childCalls.get(GREEDY)).toBe(SLICE_CALLS);
    for (const key of KEYS.filter((k) => k !== GREEDY)) expect(childOf(key)?.status).toBe("succeeded");
    for (const child of children) expect(child.usage["modelCalls"]).toBe(SLICE_CALLS);

    // Every child call is debited from the root, and root plus children come to the budget, not past it.
    const spent = children.reduce((sum, c) => sum + (c.usage["modelCalls"] ?? 0), 0);
    const { rows: root } = await db.query<{ usage: Record<string, number>; final_reply: string }>("SELECT usage, final_reply FROM runs WHERE id = $1", [rootId]);
    expect(root[0]!.usage["modelCalls"]).toBe(ROOT_CALLS + spent);
    expect(root[0]!.usage["modelCalls"]).toBe(ROOT_BUDGET);
    expect(root[0]!.final_reply).toBe(FINAL_REPLY);
    const { rows: replies } = await db.query("SELECT 1 FROM emissions WHERE run_id = $1 AND kind = 'reply'", [rootId]);
    expect(replies).toHaveLength(1);
  });
});
