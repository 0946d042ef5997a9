import { describe, expect, it } from "vitest";
import {
  activityText,
  DEFAULT_PROGRESS_CADENCE as CADENCE,
  formatDuration,
  nextNotice,
  noticeText,
  progressCadence,
  type ProgressCandidate,
  type ProgressDecision,
  type ProgressState,
} from "./progress.js";

/** A clock that moves only when the test moves it, and a ledger of what was sent when. */
class ManualClock {
  constructor(private at = Date.UTC(2026, 0, 1)) {}
  now(): Date {
    return new Date(this.at);
  }
  advance(ms: number): void {
    this.at += ms;
  }
}

const S = 1000;
const MIN = 60 * S;

/**
 * Drives nextNotice like the supervisor does: at each step of `stepMs` up to `untilMs`, sends what
 * is due and records when (ms since start) and why. Candidates arrive at the times given.
 */
function simulate(
  triage: ProgressState["triage"],
  untilMs: number,
  arrivals: readonly { at: number; candidate: ProgressCandidate }[] = [],
  stepMs = S,
): { at: number; source: string }[] {
  const clock = new ManualClock();
  const start = clock.now();
  let state: ProgressState = { startedAt: start, triage, ackText: "on it", lastNoticeAt: undefined, noticesSent: 0, candidates: [] };
  const sent: { at: number; source: string }[] = [];
  for (let t = 0; t <= untilMs; t += stepMs) {
    const now = clock.now();
    for (const arrival of arrivals) if (arrival.at === t) state = { ...state, candidates: [...state.candidates, arrival.candidate] };
    const decision = nextNotice(state, now, CADENCE);
    if (decision.kind === "send") {
      sent.push({ at: t, source: decision.source });
      const covered = decision.source === "triage_ack" ? state.candidates : [];
      state = { ...state, lastNoticeAt: now, noticesSent: state.noticesSent + 1, candidates: covered };
    }
    clock.advance(stepMs);
  }
  return sent;
}

const checkpoint = (ref: string, kind: ProgressCandidate["kind"] = "milestone", text = `did ${ref}`): ProgressCandidate => ({ ref, kind, text });

describe("progress cadence", () => {
  it("default: the first notice after 60 s of silence, then every 3 min", () => {
    expect(simulate("default", 10 * MIN)).toEqual([
      { at: 1 * MIN, source: "deadline" },
      { at: 4 * MIN, source: "deadline" },
      { at: 7 * MIN, source: "deadline" },
      { at: 10 * MIN, source: "deadline" },
    ]);
  });

  it("nothing at 59 s; the wait names the deadline", () => {
    const start = new Date(0);
    const state: ProgressState = { startedAt: start, triage: "default", ackText: undefined, lastNoticeAt: undefined, noticesSent: 0, candidates: [] };
    expect(nextNotice(state, new Date(59 * S), CADENCE)).toEqual<ProgressDecision>({ kind: "wait", until: new Date(60 * S) });
    expect(nextNotice(state, new Date(60 * S), CADENCE)).toEqual<ProgressDecision>({ kind: "send", source: "deadline" });
  });

  it("long: the stashed copy at once, then the ordinary cadence from it", () => {
    expect(simulate("long", 7 * MIN)).toEqual([
      { at: 0, source: "triage_ack" },
      { at: 3 * MIN, source: "deadline" },
      { at: 6 * MIN, source: "deadline" },
    ]);
  });

  it("trivial: nothing message-shaped, checkpoints included", () => {
    expect(simulate("trivial", 10 * MIN, [{ at: 5 * S, candidate: checkpoint("a") }])).toEqual([]);
  });

  it("triage still out: the plain deadline fires, a checkpoint waits", () => {
    expect(simulate(undefined, 2 * MIN, [{ at: 5 * S, candidate: checkpoint("a") }])).toEqual([{ at: 1 * MIN, source: "deadline" }]);
  });

  it("a checkpoint goes out sooner than the cadence, never within 1 min of the previous notice", () => {
    const sent = simulate("default", 6 * MIN, [
      { at: 10 * S, candidate: checkpoint("plan", "plan") },
      { at: 30 * S, candidate: checkpoint("m1") },
      { at: 2 * MIN, candidate: checkpoint("m2") },
    ]);
    expect(sent).toEqual([
      { at: 10 * S, source: "checkpoint" },
      // m1 came 20 s after the plan: it waits for the gap.
      { at: 70 * S, source: "checkpoint" },
      // m2 came 50 s after m1's notice: the gap again.
      { at: 130 * S, source: "checkpoint" },
      // Then silence: the cadence runs from the last notice.
      { at: 310 * S, source: "deadline" },
    ]);
  });

  it("candidates arriving together make one notice with the newest text", () => {
    const state: ProgressState = {
      startedAt: new Date(0),
      triage: "default",
      ackText: undefined,
      lastNoticeAt: undefined,
      noticesSent: 0,
      candidates: [checkpoint("a", "plan", "read the code"), checkpoint("b", "replan", "rewrite the parser first")],
    };
    expect(nextNotice(state, new Date(5 * S), CADENCE)).toEqual({ kind: "send", source: "checkpoint" });
    expect(noticeText("checkpoint", state, { kind: "unknown" }, new Date(5 * S))).toBe("Change of plan: rewrite the parser first (still working)");
  });

  it("the first workspace is a candidate like a checkpoint", () => {
    const sent = simulate("default", 2 * MIN, [{ at: 20 * S, candidate: { ref: "workspace", kind: "workspace", text: "" } }]);
    expect(sent).toEqual([{ at: 20 * S, source: "workspace" }]);
  });

  it("a continuation shares the cadence but does not speak the moment it starts", () => {
    const state: ProgressState = {
      startedAt: new Date(60 * MIN),
      triage: "default",
      ackText: undefined,
      lastNoticeAt: new Date(10 * MIN),
      noticesSent: 3,
      candidates: [],
    };
    expect(nextNotice(state, new Date(60 * MIN), CADENCE)).toEqual({ kind: "wait", until: new Date(61 * MIN) });
    // A checkpoint still keeps only the gap to the last notice.
    expect(nextNotice({ ...state, candidates: [checkpoint("a")] }, new Date(60 * MIN), CADENCE)).toEqual({ kind: "send", source: "checkpoint" });
  });

  it("settings lower the delays but cannot raise them or switch progress off", () => {
    expect(progressCadence({ firstAfterMs: 100, everyMs: 300, minGapMs: 50 })).toEqual({ firstAfterMs: 100, everyMs: 300, minGapMs: 50 });
    expect(progressCadence({ firstAfterMs: 0, everyMs: -1, minGapMs: Number.POSITIVE_INFINITY })).toEqual(CADENCE);
    expect(progressCadence({ firstAfterMs: 10 * MIN })).toEqual(CADENCE);
    expect(progressCadence({ everyMs: 1 }).everyMs).toBe(10);
    expect(progressCadence(undefined)).toEqual(CADENCE);
    // The server's and the agent's settings together: the lowest asked for each delay.
    expect(progressCadence({ firstAfterMs: 5_000 }, { firstAfterMs: 8_000, everyMs: 20_000 }, undefined)).toEqual({ firstAfterMs: 5_000, everyMs: 20_000, minGapMs: 60_000 });
  });
});

describe("progress copy", () => {
  const now = new Date(10 * MIN);
  it("says what runs and for how long", () => {
    expect(activityText({ kind: "tool", toolName: "sandbox.exec.v1", detail: "npm test", since: new Date(now.getTime() - (2 * MIN + 10 * S)) }, now)).toBe(
      "running sandbox.exec.v1 `npm test` for 2 min 10 s",
    );
    expect(activityText({ kind: "awaiting_input", askedOf: ["bob"] }, now)).toBe("waiting for an answer from bob");
    expect(activityText({ kind: "tool", toolName: "sandbox.exec.v1", detail: "ls", since: now }, now)).toBe("running sandbox.exec.v1 `ls`");
    const workspace: ProgressState = { startedAt: new Date(0), triage: "default", ackText: undefined, lastNoticeAt: undefined, noticesSent: 0, candidates: [{ ref: "workspace", kind: "workspace", text: "" }] };
    expect(noticeText("workspace", workspace, { kind: "tool", toolName: "sandbox.exec.v1", detail: "npm test", since: now }, now)).toBe(
      "Working in a sandbox workspace: running sandbox.exec.v1 `npm test`",
    );
    expect(formatDuration(45 * S)).toBe("45 s");
    expect(formatDuration(3 * MIN)).toBe("3 min");
    expect(formatDuration(63 * MIN)).toBe("1 h 3 min");
  });

  it("a long request's first notice is its stashed copy; without one, the facts", () => {
    const state: ProgressState = { startedAt: new Date(0), triage: "long", ackText: "On it: a few minutes.", lastNoticeAt: undefined, noticesSent: 0, candidates: [] };
    expect(noticeText("triage_ack", state, { kind: "unknown" }, now)).toBe("On it: a few minutes.");
    expect(noticeText("triage_ack", { ...state, ackText: undefined }, { kind: "thinking", since: new Date(now.getTime() - 5 * S) }, now)).toBe(
      "Still on it: thinking (for 5 s).",
    );
  });

  it("bounds every notice to one short line", () => {
    const state: ProgressState = { startedAt: new Date(0), triage: "default", ackText: undefined, lastNoticeAt: undefined, noticesSent: 0, candidates: [checkpoint("a", "plan", "x".repeat(1000))] };
    expect(noticeText("checkpoint", state, { kind: "unknown" }, now).length).toBeLessThanOrEqual(280);
  });
});
