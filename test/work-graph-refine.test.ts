// A refinement that reaches a running WorkGraph (issue #14): the graph is revised, not restarted.
// The refinement amends the root; the next scheduler pass starts nothing new and, once nothing
// runs, stops the graph with what finished and wakes the root, which reads the refinement and
// proposes again. Nodes proposed again unchanged keep their results: a node that wrote does not
// write twice. With no revisions left, the graph goes on and the root reads the refinement beside
// its results. Real PostgreSQL, real workers, gRPC clients; a test tool counts its real executions.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { RunStatus, WaitReason } from "../gen/keel/v1/run_pb.js";
import { GateDecision } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedModel, scriptedTurn as turn } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelTurn } from "../control-plane/src/domain/transcript.js";
import type { ModelRequest } from "../control-plane/src/models/model-provider.js";
import { grpcClient } from "./support/clients.js";
import { answeringGraphChildren, startGraphKeel, type GraphKeel } from "./support/graph-children.js";
import type { TestKeel } from "./support/keel-fixture.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";
import { until } from "./support/until.js";

const PROPOSE = "keel.propose_work_graph.v1";
const WRITE_TOOL = "test.append_line.v1";
const SLICE = { wall_clock_ms: 120_000, iterations: 3, model_calls: 3, tool_calls: 2, input_tokens: 50_000, output_tokens: 5_000, output_bytes: 100_000, cost_micro_usd: 10 };
const REFINEMENT = "Actually, ship it to staging only.";

const DRAFT = { key: "draft", kind: "agent_loop", objective: "Draft the change", tools: [WRITE_TOOL], budget: SLICE };
/** draft (which writes) → sign-off (a human gate) → ship. */
const FIRST_PLAN = {
  nodes: [
    DRAFT,
    { key: "sign-off", kind: "human_gate", objective: "A person approves the draft before it ships" },
    { key: "ship", kind: "agent_loop", objective: "Ship the approved draft", budget: SLICE },
  ],
  edges: [
    { from: "draft", to: "sign-off" },
    { from: "sign-off", to: "ship" },
  ],
};
/** After "staging only": the same draft, then a staging deploy that needs no sign-off. */
const REVISED_PLAN = {
  nodes: [DRAFT, { key: "ship-staging", kind: "agent_loop", objective: "Ship the draft to staging", budget: SLICE }],
  edges: [{ from: "draft", to: "ship-staging" }],
};

const agentOf = (id: string, maxRevisions: number): AgentSpec => {
  // The root's turns come from rootTurn below; the script is only its fallback.
  const base = scriptedAgent(id, [turn("Shipped to staging.")]);
  return {
    ...base,
    tools: [{ toolName: WRITE_TOOL, connectors: [], readOnlyCommands: [] }],
    // The fast model calls every follow-up a refinement.
    models: { primary: base.models.primary, fast: scriptedModel([turn("refines")]), decision: scriptedModel([turn("")]) },
    graph: { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 4, maxDepth: 3, maxRevisions },
  };
};
const revising = agentOf("refine-revises", 3);
const noRevisions = agentOf("refine-no-revisions", 0);

const REVISION_ASKED = "refined the request while the work graph ran";
/**
 * The root plans first; told that a refinement stopped its graph, it plans again; otherwise it
 * answers. (By what it reads, not by call count: a graph's spend, calls included, is the root's.)
 */
function rootTurn(request: ModelRequest): ModelTurn {
  const results = request.messages.filter((m) => m.role === "tool");
  const last = results.at(-1)?.content;
  const plan = results.length === 0 ? FIRST_PLAN : last?.includes(REVISION_ASKED) === true ? REVISED_PLAN : undefined;
  const usage = { inputTokens: 100, outputTokens: 10 };
  if (plan === undefined) return { text: "Shipped to staging.", toolCalls: [], usage, finishReason: "stop" };
  return { text: "", toolCalls: [{ id: `plan-${results.length}`, name: PROPOSE, argumentsJson: JSON.stringify(plan) }], usage, finishReason: "tool_calls" };
}

/** Children: a node granted the write tool writes once, then says it is done; the others just answer. */
const childInputs = new Map<string, string[]>();
const answeringChildren = answeringGraphChildren(
  (key, input, request): string | ModelTurn => {
    childInputs.set(key, [...(childInputs.get(key) ?? []), input]);
    const wrote = request.messages.some((m) => m.role === "tool");
    if (wrote || !request.tools.some((t) => t.name === WRITE_TOOL)) return `${key} done`;
    const write = { id: `write-${key}`, name: WRITE_TOOL, argumentsJson: JSON.stringify({ key }) };
    return { text: "", toolCalls: [write], usage: { inputTokens: 100, outputTokens: 10 }, finishReason: "tool_calls" };
  },
  (request) => Promise.resolve(rootTurn(request)),
);

const effectsDir = mkdtempSync(path.join(tmpdir(), "keel-refine-graph-"));
let keel: TestKeel;
let db: pg.Client;

let graph: GraphKeel | undefined;
beforeAll(async () => {
  graph = await startGraphKeel({ agents: [revising, noRevisions], tools: createTestTools({ effectsDir }), wrapRunnerDeps: answeringChildren });
  ({ keel, db } = graph);
});
afterAll(() => graph?.stop());

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);
const ingress = () => grpcClient(IngressService, keel.url, keel.tokens.connector);
const say = (agentId: string, conversationId: string, messageId: string, text: string) =>
  ingress().submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId, text, connector: "refine-test" });

/** The root parked on its gate, the draft node done. */
const waitingOnGate = (rootId: string) =>
  until("the gate to wait for a decision", async () => {
    const { run } = await runs().getRun({ runId: rootId });
    return run?.waitReason === WaitReason.HUMAN_GATE ? run : undefined;
  });

const settled = (runId: string) =>
  until(`run ${runId} to settle`, async () => {
    const { run } = await runs().getRun({ runId });
    return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status) ? run : undefined;
  });

const writesOf = (key: string) => writesRecorded(effectsDir).filter((line) => line.endsWith(` ${key}`));
const graphsOf = async (rootId: string) =>
  (await db.query<{ revision: number; status: string }>("SELECT revision, status FROM work_graphs WHERE root_run_id = $1 ORDER BY revision", [rootId])).rows;
/** Per revision and node: its status and how many child runs it had. */
const nodesOf = async (rootId: string) =>
  (
    await db.query<{ revision: number; key: string; status: string; attempts: number }>(
      `SELECT g.revision, n.key, n.status, (SELECT count(*)::int FROM work_node_attempts a WHERE a.node_id = n.id) AS attempts
       FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1 ORDER BY g.revision, n.ordinal`,
      [rootId],
    )
  ).rows;
const rootRequests = async (rootId: string) =>
  (await db.query<{ request: unknown }>("SELECT request FROM model_calls WHERE run_id = $1 ORDER BY created_at", [rootId])).rows.map((row) => JSON.stringify(row.request));
const replies = async (rootId: string) => (await db.query("SELECT 1 FROM emissions WHERE run_id = $1 AND kind = 'reply'", [rootId])).rows.length;

describe("a refinement that reaches a running WorkGraph", () => {
  it("revises the graph: what finished is kept (its write not repeated), the rest is planned again", async () => {
    const { runId: rootId } = await say(revising.id, "c-revise", "m-1", "Draft the change, then ship it once approved");
    await waitingOnGate(rootId);
    expect(writesOf("draft")).toHaveLength(1);

    const refined = await say(revising.id, "c-revise", "m-2", REFINEMENT);
    expect(refined.runId).toBe(rootId);
    const finished = await settled(rootId);
    expect(finished.status).toBe(RunStatus.SUCCEEDED);
    expect(finished.supersededByRunId).toBe("");
    expect(finished.finalReply).toBe("Shipped to staging.");

    expect(await graphsOf(rootId)).toEqual([
      { revision: 0, status: "revised" },
      { revision: 1, status: "succeeded" },
    ]);
    expect(await nodesOf(rootId)).toEqual([
      { revision: 0, key: "draft", status: "succeeded", attempts: 1 },
      { revision: 0, key: "sign-off", status: "cancelled", attempts: 0 },
      { revision: 0, key: "ship", status: "cancelled", attempts: 0 },
      // Kept: no child run, its result carried over.
      { revision: 1, key: "draft", status: "succeeded", attempts: 0 },
      { revision: 1, key: "ship-staging", status: "succeeded", attempts: 1 },
    ]);
    expect(writesOf("draft")).toHaveLength(1);
    expect(childInputs.get("draft")).toHaveLength(2); // its call before the write and the one after, in revision 0 only
    expect(childInputs.get("ship")).toBeUndefined();
    expect(childInputs.get("ship-staging")?.[0]).toContain("draft done");
    // The root planned again having read the refinement and what finished; one reply went out.
    expect((await rootRequests(rootId)).some((request) => request.includes(REFINEMENT) && request.includes(REVISION_ASKED))).toBe(true);
    expect(await replies(rootId)).toBe(1);
  });

  it("with no revisions left: the graph goes on and the root reads the refinement beside its results", async () => {
    const { runId: rootId } = await say(noRevisions.id, "c-no-revisions", "m-1", "Draft the change, then ship it once approved");
    await waitingOnGate(rootId);
    const refined = await say(noRevisions.id, "c-no-revisions", "m-2", REFINEMENT);
    expect(refined.runId).toBe(rootId);
    const { run: stillRunning } = await runs().getRun({ runId: rootId });
    expect(stillRunning?.status).toBe(RunStatus.WAITING);

    await ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "looks right" });
    const finished = await settled(rootId);
    expect(finished.status).toBe(RunStatus.SUCCEEDED);
    expect(finished.finalReply).toBe("Shipped to staging.");
    expect(await graphsOf(rootId)).toEqual([{ revision: 0, status: "succeeded" }]);
    expect((await rootRequests(rootId)).at(-1)).toContain(REFINEMENT);
    expect(await replies(rootId)).toBe(1);
  });
});
