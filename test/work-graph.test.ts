// WorkGraph through the API (issue #14): the scripted primary model proposes a graph with
// keel.propose_work_graph.v1; admission judges it; an admitted graph runs its agent_loop nodes as
// child runs claimed by the worker pool, a join combines them, and the root replies once with the
// results. Refused proposals are recorded with every reason and, past the bound, the run goes on
// as a loop. Real PostgreSQL, real workers, gRPC clients.
import { execFile } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { ExecutionShape, RunStatus, WaitReason } from "../gen/keel/v1/run_pb.js";
import { WorkNodeStatus } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS, withBudgetDefaults, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedModel, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const PROPOSE = "keel.propose_work_graph.v1";
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
const execFileAsync = promisify(execFile);
const SLICE = {
  wall_clock_ms: 120_000,
  iterations: 2,
  model_calls: 2,
  tool_calls: 1,
  input_tokens: 50_000,
  output_tokens: 5_000,
  output_bytes: 100_000,
  cost_micro_usd: 10,
};
const branch = (key: string) => ({ key, kind: "agent_loop", objective: `Work out part ${key} of the answer`, budget: SLICE });
const FAN_OUT = {
  nodes: [branch("a"), branch("b"), branch("c"), { key: "merge", kind: "join", objective: "Combine the three parts" }],
  edges: [
    { from: "a", to: "merge" },
    { from: "b", to: "merge" },
    { from: "c", to: "merge" },
  ],
};
const FINAL_REPLY = "All three parts are done; here is the combined answer.";
/** Side models answer nothing useful: triage falls back to a loop without touching the primary script. */
const QUIET = scriptedModel([turn("")]);

const fanOutBase = scriptedAgent("graph-fan-out", [turn("", [toolCall(PROPOSE, FAN_OUT)]), turn(FINAL_REPLY)]);
const fanOut: AgentSpec = {
  ...fanOutBase,
  models: { primary: fanOutBase.models.primary, fast: QUIET, decision: QUIET },
  graph: { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 6, maxDepth: 3, maxParallelism: 3 },
};

/** Refused three ways, one ceiling or more each: nodes, a tool the root lacks and the budget; depth; parallelism. */
const calls = (n: number) => ({ ...SLICE, model_calls: n });
const TOO_MANY = {
  nodes: [
    { ...branch("a"), budget: calls(4) },
    { ...branch("b"), tools: ["test.missing.v1"], budget: calls(4) },
    { ...branch("c"), budget: calls(4) },
    { ...branch("d"), budget: calls(4) },
    { ...branch("e"), budget: calls(4) },
  ],
  edges: [],
};
const TOO_DEEP = {
  nodes: ["a", "b", "c", "d"].map((key) => ({ ...branch(key), budget: calls(1) })),
  edges: [
    { from: "a", to: "b" },
    { from: "b", to: "c" },
  ],
};
const TOO_WIDE = { nodes: ["a", "b", "c"].map((key) => ({ ...branch(key), budget: calls(1) })), edges: [] };
const LOOP_REPLY = "I did it step by step myself.";
const refusedBase = scriptedAgent("graph-refused", [
  turn("", [toolCall(PROPOSE, TOO_MANY)]),
  turn("", [toolCall(PROPOSE, TOO_DEEP)]),
  turn("", [toolCall(PROPOSE, TOO_WIDE)]),
  turn(LOOP_REPLY),
]);
const refused: AgentSpec = {
  ...refusedBase,
  models: { primary: refusedBase.models.primary, fast: QUIET, decision: QUIET },
  graph: { maxNodes: 4, maxDepth: 2, maxParallelism: 2, maxRevisions: 1, maxReplans: 3 },
  budget: withBudgetDefaults({ maxModelCalls: 10 }),
};

const CHILD_MARK = /^You are doing one part of a larger task: node "([^"]+)"/;

/**
 * The children's model: a child's call waits until every branch's call has started (or 30 s
 * pass), so the branches pass only if they really run at the same time; the peak is recorded.
 */
const branches = { inFlight: 0, peak: 0, started: 0, release: undefined as (() => void) | undefined, rootSeen: undefined as (() => void) | undefined };
const allStarted = new Promise<void>((resolve) => (branches.release = resolve));
/** The branches also hold until the test has seen the root parked on them, so that state is observable. */
const rootSeenWaiting = new Promise<void>((resolve) => (branches.rootSeen = resolve));

function childAware(deps: RunnerDeps): RunnerDeps {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    async complete(request: ModelRequest) {
      const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content ?? "";
      const match = CHILD_MARK.exec(input);
      if (match === null) return scripted.complete(request);
      branches.inFlight += 1;
      branches.started += 1;
      branches.peak = Math.max(branches.peak, branches.inFlight);
      if (branches.started >= 3) branches.release?.();
      await Promise.race([allStarted, new Promise((resolve) => setTimeout(resolve, 30_000).unref())]);
      await Promise.race([rootSeenWaiting, new Promise((resolve) => setTimeout(resolve, 60_000).unref())]);
      branches.inFlight -= 1;
      return { text: `result of ${match[1]}`, toolCalls: [], usage: { inputTokens: 100, outputTokens: 10 }, finishReason: "stop" };
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
}

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 5, agents: [fanOut, refused], wrapRunnerDeps: childAware, env: { KEEL_IDLE_POLL_MS: "250" } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

async function settled(runId: string): Promise<string> {
  const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
  for (let i = 0; i < 1_200; i++) {
    const { run } = await runs.getRun({ runId });
    if (run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)) {
      return RunStatus[run.status];
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`run ${runId} did not settle`);
}

async function submit(agentId: string, conversationId: string): Promise<string> {
  const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
  const { runId } = await ingress.submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId: `m-${conversationId}`, text: "Answer in three parts", connector: "graph-test" });
  return runId;
}

describe("WorkGraph fan-out and fan-in (issue 14)", () => {
  it("runs three branches at once as child runs, joins them and replies once", async () => {
    const rootId = await submit(fanOut.id, "fan-out");
    // While its children run, the root waits on them, and the wire says so.
    const watcher = grpcClient(RunService, keel.url, keel.tokens.operator);
    let waitReason = WaitReason.UNSPECIFIED;
    for (let i = 0; i < 1_200 && waitReason !== WaitReason.AWAITING_CHILDREN; i++) {
      waitReason = (await watcher.getRun({ runId: rootId })).run?.waitReason ?? WaitReason.UNSPECIFIED;
      if (waitReason !== WaitReason.AWAITING_CHILDREN) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    branches.rootSeen?.();
    expect(WaitReason[waitReason]).toBe("AWAITING_CHILDREN");
    expect(await settled(rootId)).toBe("SUCCEEDED");
    expect(branches.peak).toBe(3);

    const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
    const { run } = await runs.getRun({ runId: rootId });
    expect(run?.shape).toBe(ExecutionShape.GRAPH);
    expect(run?.finalReply).toBe(FINAL_REPLY);

    const { graph } = await runs.getWorkGraph({ runId: rootId });
    expect(graph?.rootRunId).toBe(rootId);
    const nodes = graph?.nodes ?? [];
    expect(nodes.map((n) => [n.key, n.status])).toEqual([
      ["a", WorkNodeStatus.SUCCEEDED],
      ["b", WorkNodeStatus.SUCCEEDED],
      ["c", WorkNodeStatus.SUCCEEDED],
      ["merge", WorkNodeStatus.SUCCEEDED],
    ]);
    expect(nodes.find((n) => n.key === "merge")?.dependsOn).toEqual(["a", "b", "c"]);
    const children = nodes.filter((n) => n.key !== "merge").map((n) => n.attempts);
    for (const attempts of children) expect(attempts).toHaveLength(1);
    const childIds = children.map((attempts) => attempts[0]!.childRunId);
    // A child's graph is its root's: GetWorkGraph answers for either.
    expect((await runs.getWorkGraph({ runId: childIds[0]! })).graph?.id).toBe(graph?.id);

    const { rows: childRows } = await db.query<{ id: string; parent_run_id: string; root_run_id: string; status: string; usage: Record<string, number> }>(
      "SELECT id, parent_run_id, root_run_id, status, usage FROM runs WHERE parent_run_id = $1",
      [rootId],
    );
    expect(childRows.map((r) => r.id).sort()).toEqual([...childIds].sort());
    for (const child of childRows) expect(child).toMatchObject({ parent_run_id: rootId, root_run_id: rootId, status: "succeeded" });
    // Workers were idle, so the pass that started the children wrote them claimed for those workers:
    // each child's first claim is the pass's hand-over, at epoch 1, and no worker claimed it again.
    const { rows: claims } = await db.query<{ run_id: string; summary: string }>(
      "SELECT run_id, summary FROM run_events WHERE run_id = ANY($1::uuid[]) AND kind = 'status_changed' AND summary LIKE 'claimed by %' ORDER BY run_id, seq",
      [childIds],
    );
    expect(claims).toHaveLength(3);
    for (const claim of claims) expect(claim.summary).toMatch(/^claimed by worker-\S+ at epoch 1, handed over by the work graph pass$/);

    // The root says one thing in the thread; its children say nothing at all.
    const { rows: emissions } = await db.query<{ run_id: string; kind: string }>("SELECT run_id, kind FROM emissions WHERE run_id = ANY($1::uuid[])", [[rootId, ...childIds]]);
    expect(emissions.filter((e) => e.kind === "reply")).toEqual([{ run_id: rootId, kind: "reply" }]);
    expect(emissions.filter((e) => e.run_id !== rootId)).toEqual([]);

    // The proposing call's result is the graph's: the join's combination of the three branches.
    const { rows: proposing } = await db.query<{ status: string; result_text: string }>(
      "SELECT status, result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2",
      [rootId, PROPOSE],
    );
    expect(proposing).toHaveLength(1);
    expect(proposing[0]!.status).toBe("succeeded");
    for (const key of ["a", "b", "c"]) expect(proposing[0]!.result_text).toContain(`--- ${key} ---\nresult of ${key}`);

    // One aggregate budget: the children's spend is within their slices and is debited from the root.
    const { rows: rootRows } = await db.query<{ usage: Record<string, number> }>("SELECT usage FROM runs WHERE id = $1", [rootId]);
    const childCalls = childRows.reduce((sum, r) => sum + (r.usage["modelCalls"] ?? 0), 0);
    for (const child of childRows) expect(child.usage["modelCalls"]).toBeLessThanOrEqual(SLICE.model_calls);
    expect(childCalls).toBe(3);
    expect(rootRows[0]!.usage["modelCalls"]).toBe(2 + childCalls);
    expect(rootRows[0]!.usage["modelCalls"]).toBeLessThanOrEqual(fanOut.budget.maxModelCalls);
    expect(Number(graph?.aggregateUsage?.modelCalls ?? 0)).toBe(childCalls);

    const { rows: events } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [rootId]);
    expect(events.some((e) => e.summary.startsWith("shape loop -> graph: admitted 4 nodes"))).toBe(true);

    // `keel inspect` on the root draws the graph: the join once, under its first input.
    const { stdout } = await execFileAsync(process.execPath, [KEEL_BIN, "inspect", rootId, "--url", keel.url, "--token", keel.tokens.operator], {
      cwd: ROOT,
      env: { ...process.env, KEEL_URL: "", KEEL_TOKEN: "" },
      timeout: 60_000,
    });
    expect(stdout).toContain(`root run ${rootId.slice(0, 8)}  ← this run`);
    const childOf = (key: string) => nodes.find((n) => n.key === key)?.attempts[0]?.childRunId.slice(0, 8) ?? "?";
    expect(stdout).toMatch(new RegExp(`^├─ a  agent_loop  succeeded  run ${childOf("a")}  1 attempt  1 model call, 110 tokens, \\d+ µUSD$`, "m"));
    expect(stdout).toMatch(/^│  └─ merge  join  succeeded  .*  also after: b, c$/m);
    expect(stdout).toMatch(new RegExp(`^└─ c  agent_loop  succeeded  run ${childOf("c")}  `, "m"));
    expect(stdout).toMatch(/^4 of 4 nodes done$/m);
  });

  it("refuses a proposal over every ceiling with each reason, then falls back to a loop", async () => {
    const rootId = await submit(refused.id, "refused");
    expect(await settled(rootId)).toBe("SUCCEEDED");
    const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
    const { run } = await runs.getRun({ runId: rootId });
    expect(run?.shape).toBe(ExecutionShape.LOOP);
    expect(run?.finalReply).toBe(LOOP_REPLY);
    await expect(runs.getWorkGraph({ runId: rootId })).rejects.toThrow(/work graph/);

    const { rows: events } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [rootId]);
    const summaries = events.map((e) => e.summary);
    const reasonsOf = (attempt: number) => summaries.filter((line) => line.startsWith(`work graph proposal ${attempt} refused: `));
    const expected: readonly (readonly string[])[] = [
      ["5 nodes exceed the node ceiling of 4", 'node "b" asks for tool "test.missing.v1", which the root run cannot use', "the slices ask for 20 model_calls, but the root run has 9 left"],
      ["the longest path has 3 nodes (a -> b -> c), over the depth ceiling of 2"],
      ["up to 3 nodes could run at once, over the parallelism ceiling of 2"],
    ];
    expected.forEach((lines, i) => {
      const reasons = reasonsOf(i + 1);
      for (const line of lines) expect(reasons).toContain(`work graph proposal ${i + 1} refused: ${line}`);
    });
    expect(summaries.filter((line) => line.includes("the run continues as a loop"))).toEqual(["planning gave up after 3 refused proposal(s): the run continues as a loop"]);

    // The model was told why each time, as the call's result.
    const { rows: proposals } = await db.query<{ status: string; result_text: string }>(
      "SELECT status, result_text FROM tool_invocations WHERE run_id = $1 AND tool_name = $2 ORDER BY created_at",
      [rootId, PROPOSE],
    );
    expect(proposals.map((c) => c.status)).toEqual(["failed", "failed", "failed"]);
    expect(proposals[0]!.result_text).toContain("You may propose a corrected graph (2 more attempt(s))");
    expect(proposals[2]!.result_text).toContain("No more proposals will be accepted for this run");

    const { rows: emissions } = await db.query<{ kind: string }>("SELECT kind FROM emissions WHERE run_id = $1 AND kind = 'reply'", [rootId]);
    expect(emissions).toHaveLength(1);
    const { rows: graphs } = await db.query("SELECT id FROM work_graphs WHERE root_run_id = $1", [rootId]);
    expect(graphs).toHaveLength(0);
  });
});
