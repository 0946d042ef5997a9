import { describe, expect, it } from "vitest";
import { DEFAULT_RUN_BUDGET, type AgentSpec } from "./agent.js";
import { childInput, childSpecOverride, graphResult, NO_TOOLS } from "./work-graph-child.js";
import { planSchedule, sinkKeys, type ScheduledNode, type WorkNodeStatus } from "./work-graph-schedule.js";
import type { AdmittedWorkNode } from "./work-graph.js";

const node = (key: string, status: WorkNodeStatus, dependsOn: string[] = [], extra: Partial<ScheduledNode> = {}): ScheduledNode => ({
  key,
  kind: "agent_loop",
  status,
  dependsOn,
  output: undefined,
  ...extra,
});

describe("planSchedule", () => {
  it("starts sources up to the parallelism ceiling and holds the rest ready", () => {
    const plan = planSchedule([node("a", "pending"), node("b", "pending"), node("c", "pending"), node("j", "pending", ["a", "b", "c"], { kind: "join" })], 2);
    expect(plan).toMatchObject({ start: ["a", "b"], ready: ["c"], joined: [], cancelled: [], outcome: "running" });
  });

  it("leaves a join over workspace inputs ready for reconciliation, and what follows it waits", () => {
    const plan = planSchedule(
      [
        node("a", "succeeded", [], { output: "A" }),
        node("b", "succeeded", [], { output: "B" }),
        node("j", "pending", ["a", "b"], { kind: "join", reconciles: true }),
        node("after", "pending", ["j"]),
      ],
      4,
    );
    expect(plan).toMatchObject({ reconcile: ["j"], joined: [], start: [], outcome: "running" });
  });

  it("does not reconcile a join whose inputs have not all succeeded", () => {
    const plan = planSchedule([node("a", "succeeded"), node("b", "running"), node("j", "pending", ["a", "b"], { kind: "join", reconciles: true })], 4);
    expect(plan.reconcile).toEqual([]);
  });

  it("counts running children against the ceiling", () => {
    const plan = planSchedule([node("a", "running"), node("b", "ready"), node("c", "pending")], 2);
    expect(plan).toMatchObject({ start: ["b"], ready: ["c"], outcome: "running" });
  });

  it("completes a join once every input succeeded, and what follows it sees it done in the same pass", () => {
    const plan = planSchedule(
      [
        node("a", "succeeded", [], { output: "A" }),
        node("b", "succeeded", [], { output: "B" }),
        node("j", "pending", ["a", "b"], { kind: "join" }),
        node("after", "pending", ["j"]),
      ],
      4,
    );
    expect(plan.joined).toEqual([{ key: "j", status: "succeeded", output: "--- a ---\nA\n\n--- b ---\nB" }]);
    expect(plan.start).toEqual(["after"]);
    expect(plan.outcome).toBe("running");
  });

  it("waits for a join's last input", () => {
    const plan = planSchedule([node("a", "succeeded"), node("b", "running"), node("j", "pending", ["a", "b"], { kind: "join" })], 4);
    expect(plan).toMatchObject({ joined: [], start: [], outcome: "running" });
  });

  it("succeeds when every node is done", () => {
    const plan = planSchedule([node("a", "succeeded"), node("b", "succeeded"), node("j", "pending", ["a", "b"], { kind: "join" })], 4);
    expect(plan.outcome).toBe("succeeded");
  });

  it("after a failure starts nothing, cancels what has not run, and fails once running children end", () => {
    const running = planSchedule([node("a", "failed"), node("b", "running"), node("c", "pending"), node("j", "pending", ["a", "b", "c"], { kind: "join" })], 4);
    expect(running).toMatchObject({ start: [], cancelled: ["c", "j"], outcome: "running" });
    const ended = planSchedule([node("a", "failed"), node("b", "succeeded"), node("c", "cancelled"), node("j", "cancelled", ["a", "b", "c"], { kind: "join" })], 4);
    expect(ended.outcome).toBe("failed");
  });

  it("names the sinks", () => {
    expect(sinkKeys([node("a", "pending"), node("b", "pending", ["a"]), node("c", "pending")])).toEqual(["b", "c"]);
  });
});

describe("a node's child run", () => {
  const admitted = (tools: string[]): AdmittedWorkNode => ({
    key: "n",
    kind: "agent_loop",
    objective: "Do n",
    tools,
    budget: { ...DEFAULT_RUN_BUDGET, maxModelCalls: 3 },
    needsWorkspace: false,
    consumes: [],
    produces: [],
    subject: undefined,
    dependsOn: [],
    level: 1,
  });
  const agent = {
    tools: [
      { toolName: "x.read.v1", connectors: [], readOnlyCommands: [] },
      { toolName: "x.write.v1", connectors: [], readOnlyCommands: [] },
    ],
    policy: { kind: "restriction", allowedTools: [], allowedEffects: ["read"], pathRules: [], networkAccess: false },
  } as unknown as AgentSpec;

  it("gets the node's tools, a policy no wider than the parent's, and the node's slice", () => {
    expect(childSpecOverride(agent, admitted(["x.read.v1"]))).toEqual({
      tools: [{ toolName: "x.read.v1", connectors: [], readOnlyCommands: [] }],
      policy: { kind: "restriction", allowedTools: ["x.read.v1"], allowedEffects: ["read"], pathRules: [], networkAccess: false },
      budget: { ...DEFAULT_RUN_BUDGET, maxModelCalls: 3 },
    });
  });

  it("is offered nothing when the node names no tools (an empty allow-list would allow all)", () => {
    expect(childSpecOverride(agent, admitted([]))).toMatchObject({ tools: [], policy: { allowedTools: [NO_TOOLS] } });
  });

  it("reads its objective and its inputs' outputs; the graph's result names failures and final outputs", () => {
    expect(childInput({ key: "n", objective: "Do n" }, [{ key: "a", output: "A" }])).toContain('node "n"');
    expect(childInput({ key: "n", objective: "Do n" }, [{ key: "a", output: "A" }])).toContain("--- a ---\nA");
    const result = graphResult("failed", [
      { key: "a", status: "failed", output: "boom" },
      { key: "b", status: "succeeded", output: "B" },
    ], ["b"]);
    expect(result).toContain("The work graph failed: 1 of 2 nodes succeeded.");
    expect(result).toContain('node "a" failed: boom');
    expect(result).toContain("--- b ---\nB");
  });
});
