// WorkGraph branches with workspaces of their own (issue #14, acceptance line 1): three parallel
// child runs each write in their own Docker workspace on a real `keel sandbox-agent`, none sees
// another's files, and a join reconciles them into the root's workspace, in input order, with the
// one conflicting path reported. The root then reads the merged files and replies once.
// Real PostgreSQL, real Docker, gRPC clients; the scripted model answers root and children.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { WorkNodeStatus } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS, type AgentSpec } from "../control-plane/src/domain/agent.js";
import type { ModelTurn } from "../control-plane/src/domain/transcript.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedModel, scriptedTurn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelRequest } from "../control-plane/src/models/model-provider.js";
import { grpcClient } from "./support/clients.js";
import { answeringGraphChildren } from "./support/graph-children.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { killAllChildren, removeContainersOfHost, skipWithoutDocker, startSandboxAgent, uniqueHostId, waitFor } from "./support/sandbox-support.js";

const PROPOSE = "keel.propose_work_graph.v1";
const WRITE = "sandbox.write_file.v1";
const EXEC = "sandbox.exec.v1";
const SLICE = {
  wall_clock_ms: 120_000,
  iterations: 3,
  model_calls: 3,
  tool_calls: 3,
  input_tokens: 50_000,
  output_tokens: 5_000,
  output_bytes: 100_000,
  cost_micro_usd: 10,
};
const branch = (key: string) => ({ key, kind: "agent_loop", objective: `Write part ${key}`, tools: [WRITE, EXEC], needs_workspace: true, budget: SLICE });
const PLAN = {
  nodes: [branch("a"), branch("b"), branch("c"), { key: "merge", kind: "join", objective: "Put the three parts together" }],
  edges: ["a", "b", "c"].map((from) => ({ from, to: "merge" })),
};
const READ_BACK = "cat /workspace/parts/a.txt /workspace/parts/b.txt /workspace/parts/c.txt /workspace/shared.txt";
const FINAL_REPLY = "The three parts are in one workspace.";
const QUIET = scriptedModel([scriptedTurn("")]);
const usage = { inputTokens: 100, outputTokens: 10 };
const call = (id: string, name: string, args: unknown): ModelTurn => ({ text: "", toolCalls: [{ id, name, argumentsJson: JSON.stringify(args) }], usage, finishReason: "tool_calls" });

/** The root proposes the graph; given its result, reads the merged files in its own workspace; then answers. */
function rootTurn(request: ModelRequest): ModelTurn {
  const results = request.messages.filter((m) => m.role === "tool").length;
  if (results === 0) return call("plan", PROPOSE, PLAN);
  if (results === 1) return call("read-back", EXEC, { command: READ_BACK });
  return { text: FINAL_REPLY, toolCalls: [], usage, finishReason: "stop" };
}

/** A branch writes its part (a and c also a shared file, differently), then lists its workspace, then answers. */
function childTurn(key: string, _input: string, request: ModelRequest): string | ModelTurn {
  const results = request.messages.filter((m) => m.role === "tool").length;
  if (results === 0) {
    const calls = [{ id: `part-${key}`, name: WRITE, argumentsJson: JSON.stringify({ path: `parts/${key}.txt`, content: `part ${key}\n` }) }];
    if (key !== "b") calls.push({ id: `shared-${key}`, name: WRITE, argumentsJson: JSON.stringify({ path: "shared.txt", content: `shared as ${key} wrote it\n` }) });
    return { text: "", toolCalls: calls, usage, finishReason: "tool_calls" };
  }
  // b ends well before the others, so a sweep would release its workspace before the join unless the graph holds it.
  const wait = key === "b" ? "" : "sleep 2; ";
  if (request.messages.filter((m) => m.role === "assistant").length === 1) return call(`list-${key}`, EXEC, { command: `${wait}ls -R /workspace` });
  return `part ${key} written`;
}

const base = scriptedAgent("graph-workspaces", [scriptedTurn("")], {
  tools: toolGrants([PROPOSE, WRITE, EXEC]),
  sandbox: DEMO_AGENT.sandbox,
});
const AGENT: AgentSpec = {
  ...base,
  models: { primary: base.models.primary, fast: QUIET, decision: QUIET },
  graph: { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 6, maxDepth: 3, maxParallelism: 3 },
};

const skip = skipWithoutDocker("WorkGraph workspaces");

describe.skipIf(skip)("WorkGraph branches in workspaces of their own (issue 14)", () => {
  let keel: TestKeel;
  let db: pg.Client;
  let dataDir: string;
  const hostId = uniqueHostId("graph");

  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 5,
      agents: [AGENT],
      wrapRunnerDeps: answeringGraphChildren(childTurn, (request) => Promise.resolve(rootTurn(request))),
      // Workspaces are released as soon as their run ends: a branch's must outlive it until the join has read it.
      env: { KEEL_IDLE_POLL_MS: "250", KEEL_SANDBOX_KEEP_MS: "0", KEEL_SANDBOX_SWEEP_MS: "100" },
    });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    dataDir = await mkdtemp(path.join(tmpdir(), "keel-graph-ws-"));
    await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId), hostId, dataDir, capacity: 8 });
  }, 120_000);

  afterAll(async () => {
    await killAllChildren();
    await db?.end();
    await keel?.stop();
    removeContainersOfHost(hostId);
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  });

  it("runs three branches in three workspaces, reconciles them in a join and replies once", async () => {
    const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
    const { runId: rootId } = await ingress.submitMessage({
      agentId: AGENT.id,
      conversationId: "graph-workspaces",
      actor: { id: "alice" },
      messageId: "m-graph-workspaces",
      text: "Write the three parts",
      connector: "graph-test",
    });
    const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
    const run = await waitFor(
      `root run ${rootId} to settle`,
      async () => {
        const { run } = await runs.getRun({ runId: rootId });
        return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status) ? run : undefined;
      },
      120_000,
      200,
    );
    expect(RunStatus[run.status]).toBe("SUCCEEDED");
    expect(run.finalReply).toBe(FINAL_REPLY);

    const { graph } = await runs.getWorkGraph({ runId: rootId });
    expect(graph?.nodes.map((n) => [n.key, WorkNodeStatus[n.status]])).toEqual([
      ["a", "SUCCEEDED"],
      ["b", "SUCCEEDED"],
      ["c", "SUCCEEDED"],
      ["merge", "SUCCEEDED"],
    ]);
    const childOf = new Map(graph!.nodes.filter((n) => n.key !== "merge").map((n) => [n.key, n.attempts[0]!.childRunId]));

    // Each branch had a workspace of its own, on the Docker backend, and the root one more.
    const { rows: workspaces } = await db.query<{ id: string; run_id: string }>("SELECT id, run_id FROM workspaces WHERE run_id = ANY($1::uuid[])", [
      [rootId, ...childOf.values()],
    ]);
    expect(new Set(workspaces.map((w) => w.run_id))).toEqual(new Set([rootId, ...childOf.values()]));
    expect(new Set(workspaces.map((w) => w.id)).size).toBe(4);

    // No branch saw another's files: each listing shows its own part only.
    const { rows: listings } = await db.query<{ run_id: string; result_text: string }>(
      "SELECT run_id, result_text FROM tool_invocations WHERE run_id = ANY($1::uuid[]) AND tool_name = $2",
      [[...childOf.values()], EXEC],
    );
    expect(listings).toHaveLength(3);
    for (const [key, childId] of childOf) {
      const listing = listings.find((l) => l.run_id === childId)!.result_text;
      expect(listing).toContain(`${key}.txt`);
      for (const other of ["a", "b", "c"].filter((k) => k !== key)) expect(listing).not.toContain(`${other}.txt`);
    }

    // The join applied the parts in input order and reported the one conflict: a's shared file kept, c's not applied.
    const { rows: proposing } = await db.query<{ result_text: string }>("SELECT result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2", [
      rootId,
      PROPOSE,
    ]);
    const report = proposing[0]!.result_text;
    expect(report).toContain(`Reconciled the workspaces of "a", "b", "c" into the root run's workspace: 4 file(s) applied, 1 conflict(s).`);
    expect(report).toContain(`/workspace/shared.txt: "a" kept; "c" left a different version`);
    expect(report).toContain("--- b ---\npart b written");

    // The root read the reconciled files in its own workspace.
    const { rows: readBack } = await db.query<{ result_text: string; status: string }>(
      "SELECT result_text, status FROM tool_invocations WHERE run_id = $1 AND tool_name = $2",
      [rootId, EXEC],
    );
    expect(readBack).toHaveLength(1);
    expect(readBack[0]!.status).toBe("succeeded");
    expect(readBack[0]!.result_text).toContain("exit code 0");
    expect(readBack[0]!.result_text).toContain("part a\npart b\npart c\nshared as a wrote it");

    // The root said one thing in the thread; its children nothing.
    const { rows: emissions } = await db.query<{ run_id: string; kind: string }>("SELECT run_id, kind FROM emissions WHERE run_id = ANY($1::uuid[]) AND kind = 'reply'", [
      [rootId, ...childOf.values()],
    ]);
    expect(emissions).toEqual([{ run_id: rootId, kind: "reply" }]);

    const { rows: events } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [rootId]);
    expect(events.map((e) => e.summary)).toContain(`work graph: join "merge" reconciled its inputs' workspaces`);

    // Once the graph ended, the branches' workspaces are released like any finished run's.
    await waitFor(
      "the branches' workspaces to be released",
      async () => {
        const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM workspaces WHERE run_id = ANY($1::uuid[]) AND status = 'active'", [[...childOf.values()]]);
        return rows[0]!.n === 0 ? true : undefined;
      },
      30_000,
      200,
    );
  }, 180_000);
});
