// A refinement that reaches a WorkGraph root (issue #14): the root's commit boundary counts its
// child runs, so once a node did something external the graph is not thrown away and re-run.
// The refinement amends the root instead: the graph goes on, nothing that already ran runs again,
// and the root reads the new message beside the graph's result before its one reply. Before any
// node did something external, a refinement still supersedes the root, as for a loop run.
// Real PostgreSQL, real workers, gRPC clients; a test tool counts its real executions.
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
import { scriptedAgent, scriptedModel, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { grpcClient } from "./support/clients.js";
import { CHILD_MARK } from "./support/graph-children.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";

const PROPOSE = "keel.propose_work_graph.v1";
const WRITE_TOOL = "test.append_line.v1";
const SLICE = { wall_clock_ms: 120_000, iterations: 3, model_calls: 3, tool_calls: 2, input_tokens: 50_000, output_tokens: 5_000, output_bytes: 100_000, cost_micro_usd: 10 };
const REFINEMENT = "Actually, ship it to staging only.";

/** draft (which writes, or only reads) → sign-off (a human gate) → ship. */
const graphOf = (draftTools: string[]) => ({
  nodes: [
    { key: "draft", kind: "agent_loop", objective: "Draft the change", tools: draftTools, budget: SLICE },
    { key: "sign-off", kind: "human_gate", objective: "A person approves the draft before it ships" },
    { key: "ship", kind: "agent_loop", objective: "Ship the approved draft", budget: SLICE },
  ],
  edges: [
    { from: "draft", to: "sign-off" },
    { from: "sign-off", to: "ship" },
  ],
});

const agentOf = (id: string, draftTools: string[]): AgentSpec => {
  const base = scriptedAgent(id, [turn("", [toolCall(PROPOSE, graphOf(draftTools))]), turn("Shipped to staging.")]);
  return {
    ...base,
    tools: [{ toolName: WRITE_TOOL, connectors: [], readOnlyCommands: [] }],
    // The fast model calls every follow-up a refinement.
    models: { primary: base.models.primary, fast: scriptedModel([turn("refines")]), decision: scriptedModel([turn("")]) },
    graph: { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 4, maxDepth: 3 },
  };
};
const writing = agentOf("refine-after-write", [WRITE_TOOL]);
const reading = agentOf("refine-before-write", []);

/** Children: a node granted the write tool writes once, then says it is done; the others just answer. */
const childInputs = new Map<string, string[]>();
const answeringChildren = (deps: RunnerDeps): RunnerDeps => {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    complete(request: ModelRequest) {
      const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content;
      const key = input === undefined ? undefined : CHILD_MARK.exec(input)?.[1];
      if (input === undefined || key === undefined) return scripted.complete(request);
      childInputs.set(key, [...(childInputs.get(key) ?? []), input]);
      const wrote = request.messages.some((m) => m.role === "tool");
      const usage = { inputTokens: 100, outputTokens: 10 };
      if (!wrote && request.tools.some((t) => t.name === WRITE_TOOL)) {
        return Promise.resolve({ text: "", toolCalls: [{ id: `write-${key}`, name: WRITE_TOOL, argumentsJson: JSON.stringify({ key }) }], usage, finishReason: "tool_calls" as const });
      }
      return Promise.resolve({ text: `${key} done`, toolCalls: [], usage, finishReason: "stop" as const });
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
};

const effectsDir = mkdtempSync(path.join(tmpdir(), "keel-refine-graph-"));
let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({
    workers: 3,
    agents: [writing, reading],
    tools: createTestTools({ effectsDir }),
    wrapRunnerDeps: answeringChildren,
    env: { KEEL_IDLE_POLL_MS: "250" },
  });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);
const ingress = () => grpcClient(IngressService, keel.url, keel.tokens.connector);
const say = (agentId: string, conversationId: string, messageId: string, text: string) =>
  ingress().submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId, text, connector: "refine-test" });

async function until<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < 600; i++) {
    const seen = await probe();
    if (seen !== undefined) return seen;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

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

describe("a refinement that reaches a WorkGraph root", () => {
  it("after a node wrote: amends the root, re-runs nothing, and the reply reads the refinement", async () => {
    const { runId: rootId } = await say(writing.id, "c-after-write", "m-1", "Draft the change, then ship it once approved");
    await waitingOnGate(rootId);
    expect(writesRecorded(effectsDir).filter((line) => line.endsWith(" draft"))).toHaveLength(1);

    const refined = await say(writing.id, "c-after-write", "m-2", REFINEMENT);
    expect(refined.runId).toBe(rootId);
    const { run: stillRunning } = await runs().getRun({ runId: rootId });
    expect(stillRunning?.status).toBe(RunStatus.WAITING);
    expect(stillRunning?.supersededByRunId).toBe("");

    await ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "looks right" });
    const finished = await settled(rootId);
    expect(finished.status).toBe(RunStatus.SUCCEEDED);
    expect(finished.finalReply).toBe("Shipped to staging.");

    // The write ran once, each node once, in the one graph the root proposed.
    expect(writesRecorded(effectsDir).filter((line) => line.endsWith(" draft"))).toHaveLength(1);
    expect(childInputs.get("draft")?.length).toBe(2); // its call before the write and the one after
    const { rows: graphs } = await db.query<{ revision: number; status: string }>("SELECT revision, status FROM work_graphs WHERE root_run_id = $1", [rootId]);
    expect(graphs).toEqual([{ revision: 0, status: "succeeded" }]);
    const { rows: attempts } = await db.query<{ key: string; n: string }>(
      "SELECT n.key, count(a.id) AS n FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id LEFT JOIN work_node_attempts a ON a.node_id = n.id WHERE g.root_run_id = $1 AND n.kind = 'agent_loop' GROUP BY n.key ORDER BY n.key",
      [rootId],
    );
    expect(attempts).toEqual([
      { key: "draft", n: "1" },
      { key: "ship", n: "1" },
    ]);
    // The root's last model call saw the refinement after the graph's result; one reply went out.
    const { rows: calls } = await db.query<{ request: unknown }>("SELECT request FROM model_calls WHERE run_id = $1 ORDER BY created_at DESC LIMIT 1", [rootId]);
    expect(JSON.stringify(calls[0]?.request)).toContain(REFINEMENT);
    const { rows: replies } = await db.query("SELECT 1 FROM emissions WHERE run_id = $1 AND kind = 'reply'", [rootId]);
    expect(replies).toHaveLength(1);
  });

  it("before any node did something external: supersedes the root, as for a loop run", async () => {
    const { runId: rootId } = await say(reading.id, "c-before-write", "m-1", "Draft the change, then ship it once approved");
    await waitingOnGate(rootId);
    const refined = await say(reading.id, "c-before-write", "m-2", REFINEMENT);
    expect(refined.runId).not.toBe(rootId);
    const cancelled = await settled(rootId);
    expect(cancelled.status).toBe(RunStatus.CANCELLED);
    expect(cancelled.supersededByRunId).toBe(refined.runId);
  });
});
