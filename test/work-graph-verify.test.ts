// Verify nodes and bounded replans (issue #14): a verifier checks another node's output and fails
// the graph unless its reply starts with PASS; the root, told it may, proposes a revised graph (a
// new revision, one replan counted), and the second verification passes. A planner whose
// verifier keeps failing is refused at the replan ceiling and the root answers from what it has.
// Real PostgreSQL, real workers, gRPC clients.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { WorkNodeKind, WorkNodeStatus } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS, withBudgetDefaults, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { grpcClient } from "./support/clients.js";
import { answeringGraphChildren, type GraphKeel, graphRootAgent, NODE_SLICE, startGraphKeel } from "./support/graph-children.js";
import type { TestKeel } from "./support/keel-fixture.js";

const PROPOSE = "keel.propose_work_graph.v1";
/** A worker and its verifier; each agent's graph has its own keys, so the children's model can tell them apart. */
const checked = (work: string, check: string) => ({
  nodes: [
    { key: work, kind: "agent_loop", objective: "Work out the answer", budget: NODE_SLICE },
    { key: check, kind: "verify", objective: "The answer states its units", subject: work, budget: NODE_SLICE },
  ],
  edges: [{ from: work, to: check }],
});
const agent = (id: string, turns: ReturnType<typeof turn>[], maxReplans: number): AgentSpec => {
  const base = scriptedAgent(id, turns);
  return { ...graphRootAgent(base, { ...DEFAULT_GRAPH_CEILINGS, maxReplans }), budget: withBudgetDefaults({ maxModelCalls: 20 }) };
};
const FIXED_REPLY = "Verified on the second try: 42 metres.";
const STUBBORN_REPLY = "I could not get the answer verified; here is what I have.";
const fixed = agent("verify-replan", [turn("", [toolCall(PROPOSE, checked("answer", "check"))]), turn(FIXED_REPLY)], 2);
const stubborn = agent("verify-stubborn", [turn("", [toolCall(PROPOSE, checked("guess", "audit"))]), turn(STUBBORN_REPLY)], 1);

/** Per verifier node, its replies in order (the last one repeats). */
const VERDICTS: Record<string, string[]> = {
  check: ["FAIL: the answer gives no units", "PASS: 42 metres, units given"],
  audit: ["FAIL: still no units"],
};
const calls = new Map<string, number>();
const inputs: { key: string; input: string }[] = [];

const answeringChildren = answeringGraphChildren(
  (key, input) => {
    inputs.push({ key, input });
    const n = (calls.get(key) ?? 0) + 1;
    calls.set(key, n);
    const verdicts = VERDICTS[key];
    return verdicts === undefined ? `42 (attempt ${n})` : verdicts[Math.min(n, verdicts.length) - 1]!;
  },
  // The roots read their proposals' results as a model would: the first one proposes again while
  // it is told it may; the stubborn one keeps proposing until it is refused.
  (request, scripted) => {
    const results = request.messages.filter((m) => m.role === "tool").map((m) => m.content);
    const last = results.at(-1) ?? "";
    const stubbornRoot = request.spec.scriptedTurns?.[1]?.replyText === STUBBORN_REPLY;
    const proposeAgain = stubbornRoot ? !results.some((r) => r.includes("was refused")) : results.length === 0 || last.includes("You may propose a revised graph");
    return scripted.complete({ ...request, callIndex: proposeAgain ? 0 : 1 });
  },
);

let keel: TestKeel;
let db: pg.Client;
let graph: GraphKeel | undefined;
beforeAll(async () => {
  graph = await startGraphKeel({ agents: [fixed, stubborn], wrapRunnerDeps: answeringChildren });
  ({ keel, db } = graph);
});
afterAll(() => graph?.stop());

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);

async function finished(agentId: string, conversationId: string): Promise<string> {
  const { runId } = await grpcClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
    agentId,
    conversationId,
    actor: { id: "alice" },
    messageId: `m-${conversationId}`,
    text: "How far is it?",
    connector: "verify-test",
  });
  for (let i = 0; i < 600; i++) {
    const { run } = await runs().getRun({ runId });
    if (run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)) return runId;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`run ${runId} did not settle`);
}

async function proposals(runId: string): Promise<{ status: string; result_text: string | null }[]> {
  const { rows } = await db.query<{ status: string; result_text: string | null }>(
    "SELECT status, result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2 ORDER BY created_at",
    [runId, PROPOSE],
  );
  return rows;
}

describe("verify nodes and replans (issue 14)", () => {
  it("fails the graph on a FAIL verdict, replans once, and passes the second verification", async () => {
    const rootId = await finished(fixed.id, "verify-replan");
    const { run } = await runs().getRun({ runId: rootId });
    expect(run).toMatchObject({ status: RunStatus.SUCCEEDED, finalReply: FIXED_REPLY });

    // The verifier was handed the subject's output and told how to answer.
    const checks = inputs.filter((i) => i.key === "check");
    expect(checks).toHaveLength(2);
    expect(checks[0]!.input).toContain('You are checking the output of node "answer"');
    expect(checks[0]!.input).toContain("42 (attempt 1)");

    const [first, second] = await proposals(rootId);
    expect(first?.result_text).toContain("The work graph failed");
    expect(first?.result_text).toContain('node "check" failed: FAIL: the answer gives no units');
    expect(first?.result_text).toContain("You may propose a revised graph (replan 1 of 2)");
    expect(second?.result_text).toContain("The work graph succeeded");

    const { rows: graphs } = await db.query<{ revision: number; replans: number; status: string }>(
      "SELECT revision, replans, status FROM work_graphs WHERE root_run_id = $1 ORDER BY revision",
      [rootId],
    );
    expect(graphs).toEqual([
      { revision: 0, replans: 0, status: "failed" },
      { revision: 1, replans: 1, status: "succeeded" },
    ]);
    // GetWorkGraph shows the live (latest) revision.
    const { graph } = await runs().getWorkGraph({ runId: rootId });
    expect(graph).toMatchObject({ revision: 1, replans: 1 });
    expect(graph?.nodes.map((n) => [n.key, WorkNodeKind[n.kind], WorkNodeStatus[n.status]])).toEqual([
      ["answer", "AGENT_LOOP", "SUCCEEDED"],
      ["check", "VERIFY", "SUCCEEDED"],
    ]);
  });

  it("refuses a replan past the ceiling, and the root answers from what it has", async () => {
    const rootId = await finished(stubborn.id, "verify-stubborn");
    const { run } = await runs().getRun({ runId: rootId });
    expect(run).toMatchObject({ status: RunStatus.SUCCEEDED, finalReply: STUBBORN_REPLY });
    const [first, second, third] = await proposals(rootId);
    expect(first?.result_text).toContain("You may propose a revised graph (replan 1 of 1)");
    expect(second?.result_text).toContain("The work graph failed");
    expect(second?.result_text).toContain("Now answer the request from these results.");
    expect(third?.status).toBe("failed");
    expect(third?.result_text).toContain("The work graph was refused");
    expect(third?.result_text).toContain("this would be replan 2, over the replan ceiling of 1");
    expect(calls.get("audit")).toBe(2);
    const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM work_graphs WHERE root_run_id = $1", [rootId]);
    expect(rows[0]?.n).toBe(2);
  });
});
