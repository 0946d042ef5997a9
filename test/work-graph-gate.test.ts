// Human gates in a WorkGraph (issue #14): a gate holds what follows it until a person decides.
// The root reports WaitReason HUMAN_GATE while only the gate waits; a connector's approval
// (IngressService.DecideGate) lets the next node run with the decision in its input; an
// operator's rejection (RunService.DecideGate) fails the graph and cancels what follows. Bad
// decisions are refused with the code and the reason. Real PostgreSQL, real workers, gRPC clients.
import { execFile } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Code, ConnectError } from "@connectrpc/connect";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { RunStatus, WaitReason } from "../gen/keel/v1/run_pb.js";
import { GateDecision, WorkNodeStatus, type WorkGraph } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { grpcClient } from "./support/clients.js";
import { answeringGraphChildren, type GraphKeel, graphRootAgent, NODE_SLICE, startGraphKeel } from "./support/graph-children.js";
import type { TestKeel } from "./support/keel-fixture.js";
import { until } from "./support/until.js";

const PROPOSE = "keel.propose_work_graph.v1";
const KEEL_BIN = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "bin", "keel.js");
const execFileAsync = promisify(execFile);
const GATED = {
  nodes: [
    { key: "draft", kind: "agent_loop", objective: "Draft the change", budget: NODE_SLICE },
    { key: "sign-off", kind: "human_gate", objective: "A person approves the draft before it ships" },
    { key: "ship", kind: "agent_loop", objective: "Ship the approved draft", budget: NODE_SLICE },
  ],
  edges: [
    { from: "draft", to: "sign-off" },
    { from: "sign-off", to: "ship" },
  ],
};
const gatedAgent = (id: string, reply: string): AgentSpec => {
  const base = scriptedAgent(id, [turn("", [toolCall(PROPOSE, GATED)]), turn(reply)]);
  return graphRootAgent(base, { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 4, maxDepth: 3 });
};
const approved = gatedAgent("gate-approve", "Shipped after sign-off.");
const rejected = gatedAgent("gate-reject", "Not shipped: the sign-off was refused.");

/** An agent that requires a gate before writes: an ungated writer is refused, a gated one admitted. */
const WRITE_TOOL = "sandbox.write_file.v1";
const writer = { key: "write", kind: "agent_loop", objective: "Write the file", tools: [WRITE_TOOL], budget: NODE_SLICE };
const UNGATED = { nodes: [writer], edges: [] };
const GATED_WRITE = {
  nodes: [{ key: "ok-to-write", kind: "human_gate", objective: "A person allows the write" }, writer],
  edges: [{ from: "ok-to-write", to: "write" }],
};
const writesBase = scriptedAgent("gate-writes", [turn("", [toolCall(PROPOSE, UNGATED)]), turn("", [toolCall(PROPOSE, GATED_WRITE)]), turn("Nothing was written.")]);
const writes: AgentSpec = {
  ...graphRootAgent(writesBase, { ...DEFAULT_GRAPH_CEILINGS, requireGateBeforeWrites: true }),
  tools: [{ toolName: WRITE_TOOL, connectors: [], readOnlyCommands: [] }],
};

/** Each child's whole input, by node key: what the node was handed. */
const childInputs = new Map<string, string[]>();
const answeringChildren = answeringGraphChildren((key, input) => {
  childInputs.set(key, [...(childInputs.get(key) ?? []), input]);
  return `${key} done`;
});

let keel: TestKeel;
let db: pg.Client;

let graph: GraphKeel | undefined;
beforeAll(async () => {
  graph = await startGraphKeel({ agents: [approved, rejected, writes], wrapRunnerDeps: answeringChildren });
  ({ keel, db } = graph);
});
afterAll(() => graph?.stop());

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);
const ingress = () => grpcClient(IngressService, keel.url, keel.tokens.connector);

async function submit(agentId: string, conversationId: string): Promise<string> {
  const { runId } = await ingress().submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId: `m-${conversationId}`, text: "Draft it, then ship it once approved", connector: "gate-test" });
  return runId;
}

const node = (graph: WorkGraph | undefined, key: string) => graph?.nodes.find((n) => n.key === key);

/** The root parked on its gate: the gate BLOCKED and the wire saying HUMAN_GATE. */
async function waitingOnGate(rootId: string): Promise<WorkGraph> {
  return until("the gate to wait for a decision", async () => {
    const { run } = await runs().getRun({ runId: rootId });
    if (run?.waitReason !== WaitReason.HUMAN_GATE) return undefined;
    const { graph } = await runs().getWorkGraph({ runId: rootId });
    return node(graph, "sign-off")?.status === WorkNodeStatus.BLOCKED ? graph : undefined;
  });
}

async function settled(runId: string): Promise<RunStatus> {
  return until(`run ${runId} to settle`, async () => {
    const { run } = await runs().getRun({ runId });
    return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status) ? run.status : undefined;
  });
}

async function codeOf(call: Promise<unknown>): Promise<{ code: Code; message: string }> {
  const error = await call.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );
  if (error === undefined) throw new Error("the call succeeded");
  return { code: error.code, message: error.rawMessage };
}

describe("human gates (issue 14)", () => {
  it("holds the graph at the gate until a connector's actor approves it, then ships with the decision handed on", async () => {
    const rootId = await submit(approved.id, "gate-approve");
    const graph = await waitingOnGate(rootId);
    expect(node(graph, "draft")?.status).toBe(WorkNodeStatus.SUCCEEDED);
    expect(node(graph, "ship")?.status).toBe(WorkNodeStatus.PENDING);
    expect(childInputs.has("ship")).toBe(false);

    // Refusals name what is wrong and change nothing.
    const notAGate = await codeOf(ingress().decideGate({ runId: rootId, gateId: "draft", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "" }));
    expect(notAGate).toEqual({ code: Code.FailedPrecondition, message: 'node "draft" is a agent_loop node, not a human_gate' });
    const unknown = await codeOf(ingress().decideGate({ runId: rootId, gateId: "no-such-gate", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "" }));
    expect(unknown.code).toBe(Code.NotFound);
    const unset = await codeOf(ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.UNSPECIFIED, reason: "" }));
    expect(unset).toEqual({ code: Code.InvalidArgument, message: "decision: must be set" });
    const noReason = await codeOf(runs().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "ops" }, decision: GateDecision.APPROVE, reason: " " }));
    expect(noReason).toEqual({ code: Code.InvalidArgument, message: "reason: is required" });
    expect(node((await runs().getWorkGraph({ runId: rootId })).graph, "sign-off")?.status).toBe(WorkNodeStatus.BLOCKED);

    // By key, from the connector, with the run id of any run of the graph (here the root).
    const { runId } = await ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "the draft reads well" });
    expect(runId).toBe(rootId);
    // bob's call retried is harmless; a second decision on the used gate, either way, is refused.
    await ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "again" });
    const used = { code: Code.FailedPrecondition, message: 'gate "sign-off" was already approved by bob' };
    expect(await codeOf(runs().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "ops" }, decision: GateDecision.REJECT, reason: "changed my mind" }))).toEqual(used);
    expect(await codeOf(ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "carol" }, decision: GateDecision.APPROVE, reason: "me too" }))).toEqual(used);

    expect(await settled(rootId)).toBe(RunStatus.SUCCEEDED);
    const { run } = await runs().getRun({ runId: rootId });
    expect(run?.finalReply).toBe("Shipped after sign-off.");
    const done = (await runs().getWorkGraph({ runId: rootId })).graph;
    expect(done?.nodes.map((n) => [n.key, WorkNodeStatus[n.status]])).toEqual([
      ["draft", "SUCCEEDED"],
      ["sign-off", "SUCCEEDED"],
      ["ship", "SUCCEEDED"],
    ]);
    expect(node(done, "sign-off")).toMatchObject({ gateDecision: GateDecision.APPROVE, gateDecidedByActorId: "bob", gateReason: "the draft reads well" });
    // The graph has ended: the gate still answers as used, and bob's retry still succeeds.
    expect(await codeOf(runs().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "ops" }, decision: GateDecision.REJECT, reason: "too late" }))).toEqual(used);
    await ingress().decideGate({ runId: rootId, gateId: "sign-off", actor: { id: "bob" }, decision: GateDecision.APPROVE, reason: "retried" });
    // The node after the gate was handed the decision and what reached the gate.
    expect(childInputs.get("ship")?.[0]).toContain("Approved by bob: the draft reads well");
    expect(childInputs.get("ship")?.[0]).toContain("draft done");
    const { rows } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 AND summary LIKE 'gate %' ORDER BY seq", [rootId]);
    expect(rows.map((r) => r.summary)).toEqual(['gate "sign-off" approved by bob: the draft reads well']);
  });

  it("fails the graph when an operator rejects the gate: what follows never runs and the root answers", async () => {
    const rootId = await submit(rejected.id, "gate-reject");
    const graph = await waitingOnGate(rootId);
    const gateId = node(graph, "sign-off")!.id;
    // By node id, from an operator at the command line (RunService.DecideGate).
    const cli = (...args: string[]) => execFileAsync(process.execPath, [KEEL_BIN, ...args, "--url", keel.url, "--token", keel.tokens.operator], { timeout: 30_000 });
    await expect(cli("gate", rootId, gateId, "reject")).rejects.toMatchObject({ stderr: expect.stringContaining("gate needs --reason") as unknown });
    const { stdout } = await cli("gate", rootId, gateId, "reject", "--reason", "not this week", "--actor", "ops");
    expect(stdout.trim()).toBe(`gate ${gateId} of run ${rootId} rejected by ops: the graph fails and what follows it is cancelled`);
    const after = (await runs().getWorkGraph({ runId: rootId })).graph;
    expect(node(after, "sign-off")).toMatchObject({ gateDecision: GateDecision.REJECT, gateDecidedByActorId: "ops", gateReason: "not this week" });

    expect(await settled(rootId)).toBe(RunStatus.SUCCEEDED);
    const { run } = await runs().getRun({ runId: rootId });
    expect(run?.finalReply).toBe("Not shipped: the sign-off was refused.");
    const done = (await runs().getWorkGraph({ runId: rootId })).graph;
    expect(done?.nodes.map((n) => [n.key, WorkNodeStatus[n.status]])).toEqual([
      ["draft", "SUCCEEDED"],
      ["sign-off", "FAILED"],
      ["ship", "CANCELLED"],
    ]);
    expect(childInputs.get("ship")).toHaveLength(1);
    // The proposal's result, which the root read before answering, says the graph failed at the gate.
    const { rows } = await db.query<{ result_text: string }>("SELECT result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2", [rootId, PROPOSE]);
    expect(rows[0]?.result_text).toContain("The work graph failed");
    expect(rows[0]?.result_text).toContain('node "sign-off" failed: Rejected by ops: not this week');
  });

  it("refuses a node that may write with no gate before it when the agent requires one, and admits it behind a gate", async () => {
    const rootId = await submit(writes.id, "gate-writes");
    const graph = await until("the gated proposal to park on its gate", async () => {
      const { run } = await runs().getRun({ runId: rootId });
      return run?.waitReason === WaitReason.HUMAN_GATE ? (await runs().getWorkGraph({ runId: rootId })).graph : undefined;
    });
    expect(graph?.nodes.map((n) => [n.key, WorkNodeStatus[n.status]])).toEqual([
      ["ok-to-write", "BLOCKED"],
      ["write", "PENDING"],
    ]);
    const { rows } = await db.query<{ status: string; result_text: string | null }>(
      "SELECT status, result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2 ORDER BY created_at",
      [rootId, PROPOSE],
    );
    expect(rows[0]?.status).toBe("failed");
    expect(rows[0]?.result_text).toContain(`node "write" may use write tool "${WRITE_TOOL}" with no human_gate before it`);
    expect(rows[1]?.status).toBe("pending");
    await runs().decideGate({ runId: rootId, gateId: "ok-to-write", actor: { id: "ops" }, decision: GateDecision.REJECT, reason: "no writes today" });
    expect(await settled(rootId)).toBe(RunStatus.SUCCEEDED);
    expect(childInputs.has("write")).toBe(false);
  });
});
