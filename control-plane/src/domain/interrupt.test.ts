import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { InterruptScope, InterruptSettings } from "./agent.js";
import {
  allowedBehaviour,
  coalesceUntil,
  continuationAuthorized,
  decideFollowUp,
  FOLLOW_UP_RELATIONS,
  inCoalesceWindow,
  inheritablePrefix,
  intentOf,
  interruptCounts,
  interruptsOpen,
  partialResultReply,
  phaseOf,
  planAdmission,
  type AdmissionPlan,
  type ConsentAnswer,
  type FollowUpBehaviour,
  type FollowUpIntent,
  type FollowUpRelation,
  type InheritableStep,
  type RunAudience,
  type RunPhase,
  type TargetRun,
} from "./interrupt.js";

const SETTINGS: InterruptSettings = { coalesceWindowMs: 2_000, scope: "thread_scoped", maxSupersessions: 3, supersessionCeilingMs: 60_000 };
const T0 = new Date("2026-01-01T00:00:00Z");
const at = (ms: number) => new Date(T0.getTime() + ms);

describe("the downgrade matrix: configured intent x run state", () => {
  // Every cell, with interrupts open and closed. Past the commit boundary nothing restarts.
  it.each<[FollowUpIntent, RunPhase, boolean, FollowUpBehaviour]>([
    ["supersede", "pending", true, "join"],
    ["supersede", "buffering", true, "supersede"],
    ["supersede", "committed", true, "amend"],
    ["amend", "pending", true, "join"],
    ["amend", "buffering", true, "amend"],
    ["amend", "committed", true, "amend"],
    ["queue", "pending", true, "queue"],
    ["queue", "buffering", true, "queue"],
    ["queue", "committed", true, "queue"],
    ["cancel", "pending", true, "cancel"],
    ["cancel", "buffering", true, "cancel"],
    ["cancel", "committed", true, "stop_with_partial"],
    // The starvation bound closes a started run to interrupts; a pending run is only joined.
    ["supersede", "pending", false, "join"],
    ["supersede", "buffering", false, "queue"],
    ["supersede", "committed", false, "queue"],
    ["amend", "pending", false, "join"],
    ["amend", "buffering", false, "queue"],
    ["amend", "committed", false, "queue"],
    ["queue", "pending", false, "queue"],
    ["queue", "buffering", false, "queue"],
    ["queue", "committed", false, "queue"],
    ["cancel", "pending", false, "cancel"],
    ["cancel", "buffering", false, "cancel"],
    ["cancel", "committed", false, "stop_with_partial"],
  ])("%s while %s (interrupts open: %s) → %s", (intent, phase, open, expected) => {
    expect(allowedBehaviour(intent, phase, open)).toBe(expected);
  });

  it("never restarts a committed run, whatever the intent", () => {
    fc.assert(
      fc.property(fc.constantFrom<FollowUpIntent>("supersede", "amend", "queue", "cancel"), fc.boolean(), (intent, open) => {
        expect(allowedBehaviour(intent, "committed", open)).not.toBe("supersede");
        expect(allowedBehaviour(intent, "committed", open)).not.toBe("join");
      }),
    );
  });

  it.each<[FollowUpRelation, FollowUpIntent]>([
    ["refines", "supersede"],
    ["independent", "queue"],
    ["cancels", "cancel"],
  ])("%s means %s", (relation, intent) => {
    expect(intentOf(relation)).toBe(intent);
  });

  it.each<[boolean, "buffering" | "committed", RunPhase]>([
    [false, "buffering", "pending"],
    [false, "committed", "pending"],
    [true, "buffering", "buffering"],
    [true, "committed", "committed"],
  ])("started=%s with boundary %s is %s", (started, commitBoundary, phase) => {
    expect(phaseOf({ started, commitBoundary })).toBe(phase);
  });
});

describe("whose interrupt counts", () => {
  const alone: RunAudience = { requesterId: "alice", addressedActorIds: ["alice"] };
  // Alice asked; Bob answered the run's question, so the agent is now answering him too.
  const answered: RunAudience = { requesterId: "alice", addressedActorIds: ["alice", "bob"] };
  it.each<[InterruptScope, RunAudience, string, boolean]>([
    ["same_actor_only", alone, "alice", true],
    ["same_actor_only", alone, "bob", false],
    ["same_actor_only", answered, "bob", false],
    ["same_actor_only", answered, "carol", false],
    ["thread_scoped", alone, "alice", true],
    ["thread_scoped", alone, "bob", true],
    ["thread_scoped", answered, "carol", true],
    ["addressed_actor_only", alone, "alice", true],
    ["addressed_actor_only", alone, "bob", false],
    ["addressed_actor_only", answered, "bob", true],
    ["addressed_actor_only", answered, "carol", false],
  ])("%s, audience %j, from %s → %s", (scope, audience, actor, expected) => {
    expect(interruptCounts(scope, audience, actor)).toBe(expected);
  });

  it("the requester always counts", () => {
    fc.assert(
      fc.property(fc.constantFrom<InterruptScope>("same_actor_only", "thread_scoped", "addressed_actor_only"), fc.array(fc.string()), (scope, others) => {
        expect(interruptCounts(scope, { requesterId: "r", addressedActorIds: others }, "r")).toBe(true);
      }),
    );
  });
});

describe("the starvation bound", () => {
  it.each<[number, number, boolean]>([
    [0, 0, true],
    [2, 59_999, true],
    [3, 0, false], // the maximum number of interrupts is reached
    [0, 60_000, false], // the wall-clock ceiling has passed
    [5, 120_000, false],
  ])("%i interrupts, %i ms after the request → open: %s", (interruptions, elapsed, open) => {
    expect(interruptsOpen(SETTINGS, { interruptions, requestReceivedAt: T0 }, at(elapsed))).toBe(open);
  });
});

describe("one follow-up: relation x policy x boundary x starvation", () => {
  const base = {
    actorId: "alice",
    scope: "thread_scoped" as InterruptScope,
    settings: SETTINGS,
    audience: { requesterId: "alice", addressedActorIds: ["alice"] },
    interruptions: 0,
    requestReceivedAt: T0,
    now: at(5_000),
  };
  type Row = [FollowUpRelation, RunPhase, InterruptScope, string, number, number, FollowUpBehaviour];
  const rows: Row[] = [];
  // Every relation x phase x scope x actor, open and closed, against the expected behaviour.
  for (const relation of FOLLOW_UP_RELATIONS) {
    for (const phase of ["pending", "buffering", "committed"] as const) {
      for (const scope of ["same_actor_only", "thread_scoped", "addressed_actor_only"] as const) {
        for (const actor of ["alice", "bob"]) {
          for (const [interruptions, elapsed] of [
            [0, 5_000],
            [3, 5_000],
            [0, 90_000],
          ] as const) {
            const counts = actor === "alice" || scope === "thread_scoped";
            const open = interruptions < 3 && elapsed < 60_000;
            const expected: FollowUpBehaviour = counts ? allowedBehaviour(intentOf(relation), phase, open) : "queue";
            rows.push([relation, phase, scope, actor, interruptions, elapsed, expected]);
          }
        }
      }
    }
  }
  it.each(rows)("%s while %s under %s from %s (%i interrupts, %i ms) → %s", (relation, phase, scope, actorId, interruptions, elapsed, expected) => {
    const decision = decideFollowUp({ ...base, relation, phase, scope, actorId, interruptions, now: at(elapsed) });
    expect(decision.behaviour).toBe(expected);
    expect(decision.why).not.toBe("");
  });

  it("has exactly the rows a reader expects for the spec's examples", () => {
    const buffering = { ...base, phase: "buffering" as const };
    expect(decideFollowUp({ ...buffering, relation: "refines" }).behaviour).toBe("supersede"); // "actually, in rust"
    expect(decideFollowUp({ ...buffering, relation: "independent" }).behaviour).toBe("queue"); // "also, what's the weather"
    expect(decideFollowUp({ ...buffering, relation: "cancels" }).behaviour).toBe("cancel"); // "never mind, stop"
    expect(decideFollowUp({ ...base, phase: "committed", relation: "refines" }).behaviour).toBe("amend");
    expect(decideFollowUp({ ...base, phase: "committed", relation: "cancels" }).behaviour).toBe("stop_with_partial");
  });

  it("revises a running work graph rather than restarting it: a refinement amends its root in either phase", () => {
    for (const phase of ["buffering", "committed"] as const) {
      const decision = decideFollowUp({ ...base, phase, relation: "refines", graphRunning: true });
      expect(decision).toMatchObject({ behaviour: "amend" });
      expect(decision.why).toContain("work graph");
    }
    // The rest is as for any run: a cancel still cancels, a queue still queues, a closed bound still queues.
    expect(decideFollowUp({ ...base, phase: "buffering", relation: "cancels", graphRunning: true }).behaviour).toBe("cancel");
    expect(decideFollowUp({ ...base, phase: "buffering", relation: "independent", graphRunning: true }).behaviour).toBe("queue");
    expect(decideFollowUp({ ...base, phase: "buffering", relation: "refines", graphRunning: true, interruptions: 3 }).behaviour).toBe("queue");
  });
});

describe("coalescing", () => {
  it.each<[boolean, number, number, boolean]>([
    [false, 2_000, 1_999, true],
    [false, 2_000, 2_000, false], // the window has ended
    [false, 0, 0, false], // a zero window never coalesces
    [true, 2_000, 500, false], // started runs are interrupted, not joined
  ])("started=%s, not before %i, now %i → inside the window: %s", (started, notBefore, now, inside) => {
    expect(inCoalesceWindow({ started, notBefore: at(notBefore) }, at(now))).toBe(inside);
  });

  it("waits the window after the latest message, but never past the request's cap", () => {
    expect(coalesceUntil(SETTINGS, T0, at(0))).toEqual(at(2_000));
    expect(coalesceUntil(SETTINGS, T0, at(1_500))).toEqual(at(3_500));
    expect(coalesceUntil(SETTINGS, T0, at(59_000))).toEqual(at(60_000));
    expect(coalesceUntil({ ...SETTINGS, coalesceWindowMs: 0 }, T0, at(7))).toEqual(at(7));
  });

  it("a steady drip cannot postpone a run forever", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 1_999 }), { maxLength: 200 }), (gaps) => {
        let now = 0;
        let until = coalesceUntil(SETTINGS, T0, at(0));
        for (const gap of gaps) {
          now += gap;
          if (!inCoalesceWindow({ started: false, notBefore: until }, at(now))) break;
          until = coalesceUntil(SETTINGS, T0, at(now));
        }
        expect(until.getTime() - T0.getTime()).toBeLessThanOrEqual(SETTINGS.supersessionCeilingMs);
      }),
    );
  });
});

describe("continuation consent", () => {
  it.each<[ConsentAnswer, string, boolean]>([
    ["yes", "alice", true],
    ["no", "alice", false],
    ["unclear", "alice", false],
    ["yes", "bob", false], // another actor's yes
    ["no", "bob", false],
  ])("%s from %s → authorized: %s", (answer, actorId, authorized) => {
    expect(continuationAuthorized({ answer, actorId, requesterId: "alice" })).toBe(authorized);
  });
});

describe("planning one message's admission", () => {
  const target = (overrides: Partial<TargetRun> = {}): TargetRun => ({
    runId: "run-1",
    started: true,
    notBefore: T0,
    commitBoundary: "buffering",
    audience: { requesterId: "alice", addressedActorIds: ["alice"] },
    interruptions: 0,
    requestReceivedAt: T0,
    ...overrides,
  });
  const plan = (overrides: Partial<Parameters<typeof planAdmission>[0]>): AdmissionPlan =>
    planAdmission({ state: { target: undefined, exhausted: undefined }, actorId: "alice", scope: "thread_scoped", settings: SETTINGS, now: at(1_000), ...overrides });
  const exhausted = { runId: "run-0", requesterId: "alice" };

  it.each<[string, Partial<Parameters<typeof planAdmission>[0]>, AdmissionPlan["kind"]]>([
    ["an empty conversation", {}, "new_request"],
    ["inside the window", { state: { target: target({ started: false, notBefore: at(2_000) }), exhausted: undefined } }, "join"],
    // A reading of the clock taken before the conversation's lock may predate a run admitted meanwhile.
    ["a window of 0, a pending run starting after this message's clock reading", { settings: { ...SETTINGS, coalesceWindowMs: 0 }, state: { target: target({ started: false, notBefore: at(2_000) }), exhausted: undefined } }, "needs_relation"],
    ["inside the window, from someone who may not interrupt", { scope: "same_actor_only", actorId: "bob", state: { target: target({ started: false, notBefore: at(2_000) }), exhausted: undefined } }, "new_request"],
    ["a running run, relation unknown", { state: { target: target(), exhausted: undefined } }, "needs_relation"],
    ["a running run, from someone who may not interrupt", { scope: "same_actor_only", actorId: "bob", state: { target: target(), exhausted: undefined } }, "new_request"],
    ["a buffering run, refines", { relation: "refines", state: { target: target(), exhausted: undefined } }, "supersede"],
    ["a committed run, refines", { relation: "refines", state: { target: target({ commitBoundary: "committed" }), exhausted: undefined } }, "amend"],
    ["a pending run past its window, refines", { relation: "refines", state: { target: target({ started: false, notBefore: at(0) }), exhausted: undefined } }, "join"],
    ["a buffering run, independent", { relation: "independent", state: { target: target(), exhausted: undefined } }, "new_request"],
    ["a buffering run, cancels", { relation: "cancels", state: { target: target(), exhausted: undefined } }, "cancel"],
    ["an exhausted run, its requester, no answer yet", { state: { target: undefined, exhausted } }, "needs_consent"],
    ["an exhausted run, its requester says yes", { consent: "yes", state: { target: undefined, exhausted } }, "continue"],
    ["an exhausted run, its requester says no", { consent: "no", state: { target: undefined, exhausted } }, "record"],
    ["an exhausted run, an unclear reply", { consent: "unclear", state: { target: undefined, exhausted } }, "new_request"],
    ["an exhausted run, another actor's yes", { actorId: "bob", consent: "yes", state: { target: undefined, exhausted } }, "new_request"],
  ])("%s → %s", (_name, overrides, kind) => {
    expect(plan(overrides).kind).toBe(kind);
  });

  it("cancelling a committed run asks for a partial result", () => {
    const cancelled = plan({ relation: "cancels", state: { target: target({ commitBoundary: "committed" }), exhausted: undefined } });
    expect(cancelled).toMatchObject({ kind: "cancel", partial: true });
  });

  it("joining inside the window moves the start to the window after the latest message", () => {
    const joined = plan({ state: { target: target({ started: false, notBefore: at(2_000) }), exhausted: undefined } });
    expect(joined).toMatchObject({ kind: "join", notBefore: at(3_000) });
  });
});

describe("inherited work", () => {
  const step = (replayability: "replayable" | "not_replayable", ...statuses: InheritableStep["invocations"][number]["status"][]): InheritableStep => ({
    replayability,
    invocations: statuses.map((status) => ({ status, refusalReason: status === "refused" ? "not run: the run was cancelled" : undefined, resolvedOutcome: undefined })),
  });
  it.each<[string, InheritableStep[], "replayable_only" | "all_settled", number]>([
    ["completed reads", [step("replayable", "succeeded"), step("replayable", "failed", "succeeded")], "replayable_only", 2],
    ["a step cut short by the stop", [step("replayable", "succeeded"), step("replayable", "succeeded", "refused")], "replayable_only", 1],
    ["an interrupted read", [step("replayable", "interrupted"), step("replayable", "succeeded")], "replayable_only", 0],
    ["a pending call", [step("replayable", "succeeded"), step("replayable", "pending")], "replayable_only", 1],
    ["an effect, superseding", [step("replayable", "succeeded"), step("not_replayable", "succeeded")], "replayable_only", 1],
    ["an effect, continuing", [step("replayable", "succeeded"), step("not_replayable", "succeeded")], "all_settled", 2],
    ["an unsettled unknown outcome", [step("not_replayable", "unknown_outcome")], "all_settled", 0],
  ])("%s → %i step(s)", (_name, steps, mode, kept) => {
    expect(inheritablePrefix(steps, mode)).toHaveLength(kept);
  });

  it("keeps a policy refusal, which is a real answer", () => {
    const refused: InheritableStep = { replayability: "replayable", invocations: [{ status: "refused", refusalReason: "the policy does not allow writes", resolvedOutcome: undefined }] };
    expect(inheritablePrefix([refused], "replayable_only")).toHaveLength(1);
  });
});

describe("the partial result of a stopped committed run", () => {
  it("names the effects that were not undone", () => {
    const reply = partialResultReply({ stoppedBy: "alice", stepsDone: 2, effects: ["test.append_line.v1"] });
    expect(reply).toContain("as alice asked");
    expect(reply).toContain("were not undone");
    expect(reply).toContain("- test.append_line.v1");
  });
});
