import { describe, expect, it } from "vitest";
import { judgeGateDecision, planSchedule, type ScheduledNode, type WorkNodeStatus } from "./work-graph-schedule.js";

const node = (key: string, status: WorkNodeStatus, dependsOn: string[] = [], extra: Partial<ScheduledNode> = {}): ScheduledNode => ({
  key,
  kind: "agent_loop",
  status,
  dependsOn,
  output: undefined,
  ...extra,
});
const gate = (status: WorkNodeStatus, extra: Partial<ScheduledNode> = {}) => node("gate", status, ["a"], { kind: "human_gate", ...extra });

describe("human gates in planSchedule", () => {
  it("holds a gate whose inputs succeeded until it is decided, and nothing after it starts", () => {
    const plan = planSchedule([node("a", "succeeded", [], { output: "A" }), gate("pending"), node("b", "pending", ["gate"])], 4);
    expect(plan).toMatchObject({ awaitingDecision: ["gate"], start: [], joined: [], cancelled: [], outcome: "running" });
  });

  it("does not hold a gate before its inputs are done", () => {
    const plan = planSchedule([node("a", "running"), gate("pending"), node("b", "pending", ["gate"])], 4);
    expect(plan).toMatchObject({ awaitingDecision: [], start: [], outcome: "running" });
  });

  it("lets an approved gate through with who and why ahead of what reached it, and starts what follows", () => {
    const plan = planSchedule(
      [node("a", "succeeded", [], { output: "A" }), gate("blocked", { gate: { decision: "approve", actorId: "ops", reason: "looks safe" } }), node("b", "pending", ["gate"])],
      4,
    );
    expect(plan.joined).toEqual([{ key: "gate", status: "succeeded", output: "Approved by ops: looks safe\n\n--- a ---\nA" }]);
    expect(plan.start).toEqual(["b"]);
    expect(plan.outcome).toBe("running");
  });

  it("fails the graph on a rejected gate: what follows is cancelled and the graph ends failed", () => {
    const plan = planSchedule(
      [node("a", "succeeded", [], { output: "A" }), gate("blocked", { gate: { decision: "reject", actorId: "ops", reason: "too risky" } }), node("b", "pending", ["gate"])],
      4,
    );
    expect(plan.joined).toEqual([{ key: "gate", status: "failed", output: "Rejected by ops: too risky\n\n--- a ---\nA" }]);
    expect(plan).toMatchObject({ start: [], cancelled: ["b"], outcome: "failed" });
  });

  it("cancels a waiting gate when another branch failed", () => {
    const plan = planSchedule([node("a", "succeeded"), node("x", "failed"), gate("blocked"), node("b", "pending", ["gate"])], 4);
    expect(plan).toMatchObject({ cancelled: ["gate", "b"], awaitingDecision: [], outcome: "failed" });
  });

  it("keeps the graph running while a gate waits beside finished branches", () => {
    const plan = planSchedule([node("a", "succeeded"), gate("blocked"), node("c", "succeeded")], 4);
    expect(plan).toMatchObject({ awaitingDecision: ["gate"], outcome: "running" });
  });
});

describe("judgeGateDecision", () => {
  const facts = (over: Partial<Parameters<typeof judgeGateDecision>[0]> = {}) => ({
    key: "gate",
    kind: "human_gate",
    status: "blocked",
    decision: undefined,
    decidedBy: undefined,
    ...over,
  });

  it("records a decision on a gate that waits for one", () => {
    expect(judgeGateDecision(facts(), "approve", "ops")).toEqual({ kind: "record" });
    expect(judgeGateDecision(facts(), "reject", "ops")).toEqual({ kind: "record" });
  });

  it("answers the decider's own decision again as done and refuses any other", () => {
    const used = facts({ status: "succeeded", decision: "approve", decidedBy: "ops" });
    expect(judgeGateDecision(used, "approve", "ops")).toEqual({ kind: "already" });
    const refused = { kind: "refuse", reason: 'gate "gate" was already approved by ops' };
    expect(judgeGateDecision(used, "reject", "ops")).toEqual(refused);
    expect(judgeGateDecision(used, "approve", "someone-else")).toEqual(refused);
  });

  it("refuses nodes that are not gates, gates not reached yet and cancelled gates, saying why", () => {
    expect(judgeGateDecision(facts({ kind: "agent_loop" }), "approve", "ops")).toEqual({ kind: "refuse", reason: 'node "gate" is a agent_loop node, not a human_gate' });
    expect(judgeGateDecision(facts({ status: "pending" }), "approve", "ops")).toEqual({
      kind: "refuse",
      reason: 'gate "gate" is not waiting for a decision yet: the nodes before it have not all succeeded',
    });
    expect(judgeGateDecision(facts({ status: "cancelled" }), "approve", "ops")).toEqual({
      kind: "refuse",
      reason: 'gate "gate" is cancelled: a node before it failed or the root run stopped',
    });
  });
});
