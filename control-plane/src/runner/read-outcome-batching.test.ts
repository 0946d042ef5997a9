import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "../domain/run.js";
import { batchReadOutcomes } from "./read-outcome-batching.js";
import type { RunControlState, RunStore, StepCommit, ToolOutcomeCommit } from "./run-store.js";

const CONTROL: RunControlState = { cancelRequestedByActorId: undefined, supersededByRunId: undefined, paused: false, policy: { kind: "allow_all" } as never, triggerCount: 1 };
const FENCE = { runId: "run-1", workerId: "w", epoch: 1 };

function recordingStore(fail?: () => Error | undefined) {
  const commits: { kind: "step" | "outcome" | "release"; commit: Partial<StepCommit & ToolOutcomeCommit> }[] = [];
  const reads: string[] = [];
  const store = {
    commitStep: (commit: StepCommit) => {
      const error = fail?.();
      if (error !== undefined) return Promise.reject(error);
      commits.push({ kind: "step", commit });
      return Promise.resolve({ ...CONTROL, triggerCount: commits.length + 1 });
    },
    commitToolOutcome: (commit: ToolOutcomeCommit) => {
      commits.push({ kind: "outcome", commit });
      return Promise.resolve({ ...CONTROL, triggerCount: commits.length + 1 });
    },
    readControl: () => {
      reads.push("read");
      return Promise.resolve({ ...CONTROL, cancelRequestedByActorId: "fresh" });
    },
    release: () => {
      commits.push({ kind: "release", commit: {} });
      return Promise.resolve();
    },
  } as unknown as RunStore;
  return { store, commits, reads };
}

function outcome(invocationId: string, effect: "read" | "write", outcome: ToolOutcomeCommit["outcome"] = "succeeded"): ToolOutcomeCommit {
  return { ...FENCE, invocationId, effect, outcome, resultText: "r", artifacts: [], status: "running", usage: ZERO_USAGE, emissions: [], summary: `${invocationId} done` };
}

function step(index: number): StepCommit {
  return { ...FENCE, step: undefined, status: "awaiting_tool", usage: ZERO_USAGE, emissions: [], summary: `step ${index}` };
}

const ids = (list: readonly { invocationId: string }[] | undefined) => (list ?? []).map((o) => o.invocationId);

describe("read results ride with the run's next commit", () => {
  it("holds a finished read and commits it with the next step, before it, in one commit", async () => {
    const { store, commits } = recordingStore();
    const batching = batchReadOutcomes(store, { flushAfterMs: 10_000 });
    // Nothing committed, but the control state is read fresh (a cancel must not wait a step).
    expect((await batching.commitToolOutcome(outcome("read-1", "read"))).cancelRequestedByActorId).toBe("fresh");
    await batching.commitToolOutcome(outcome("read-2", "read"));
    expect(commits).toHaveLength(0);
    await batching.commitStep(step(2));
    expect(commits).toHaveLength(1);
    expect(ids(commits[0]!.commit.priorOutcomes)).toEqual(["read-1", "read-2"]);
    batching.close();
  });

  it("commits held reads on their own when the next commit does not come within the flush time", async () => {
    const { store, commits } = recordingStore();
    const batching = batchReadOutcomes(store, { flushAfterMs: 20 });
    await batching.commitToolOutcome(outcome("read-1", "read"));
    await new Promise((resolve) => setTimeout(resolve, 80));
    expect(commits).toHaveLength(1);
    expect(commits[0]!.commit).toMatchObject({ step: undefined, status: "running", summary: "read-1 done" });
    expect(ids(commits[0]!.commit.priorOutcomes)).toEqual(["read-1"]);
    // Flushed once: the next commit carries nothing more.
    await batching.commitStep(step(2));
    expect(commits[1]!.commit.priorOutcomes).toBeUndefined();
    batching.close();
  });

  it("never holds a write, a refusal or an interruption; they carry held reads with them", async () => {
    for (const immediate of [outcome("write-1", "write"), outcome("read-x", "read", "refused"), outcome("read-y", "read", "interrupted")]) {
      const { store, commits } = recordingStore();
      const batching = batchReadOutcomes(store, { flushAfterMs: 10_000 });
      await batching.commitToolOutcome(outcome("read-1", "read"));
      await batching.commitToolOutcome(immediate);
      expect(commits).toHaveLength(1);
      expect(commits[0]!.kind).toBe("outcome");
      expect(commits[0]!.commit.invocationId).toBe(immediate.invocationId);
      expect(ids(commits[0]!.commit.priorOutcomes)).toEqual(["read-1"]);
      batching.close();
    }
  });

  it("commits held reads before handing the run back", async () => {
    const { store, commits } = recordingStore();
    const batching = batchReadOutcomes(store, { flushAfterMs: 10_000 });
    await batching.commitToolOutcome(outcome("read-1", "read"));
    await batching.release(FENCE, "shutting down");
    expect(commits.map((c) => c.kind)).toEqual(["step", "release"]);
    expect(ids(commits[0]!.commit.priorOutcomes)).toEqual(["read-1"]);
  });

  it("reports a failed timed flush on the driver's next commit instead of losing it silently", async () => {
    let failing = true;
    const { store } = recordingStore(() => (failing ? new Error("lease lost") : undefined));
    const reported: unknown[] = [];
    const batching = batchReadOutcomes(store, { flushAfterMs: 10, onFlushError: (error) => reported.push(error) });
    await batching.commitToolOutcome(outcome("read-1", "read"));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(reported).toHaveLength(1);
    failing = false;
    await expect(batching.commitStep(step(2))).rejects.toThrow("lease lost");
    batching.close();
  });

  it("with change signals, reads the control state only when a change was signalled since the last commit", async () => {
    const { store, reads } = recordingStore();
    let signal: () => void = () => {};
    const batching = batchReadOutcomes(store, {
      flushAfterMs: 10_000,
      watchControl: (changed) => {
        signal = changed;
        return () => {};
      },
    });
    await batching.commitStep(step(1));
    expect(await batching.commitToolOutcome(outcome("read-1", "read"))).toMatchObject({ cancelRequestedByActorId: undefined, triggerCount: 2 });
    expect(reads).toEqual([]);
    signal();
    expect(await batching.commitToolOutcome(outcome("read-2", "read"))).toMatchObject({ cancelRequestedByActorId: "fresh" });
    expect(reads).toEqual(["read"]);
    batching.close();
  });

  it("holds the reads again when a reply guarded against a stop is refused, for the commit that stops the run", async () => {
    const commits: StepCommit[] = [];
    const store = {
      commitStep: (commit: StepCommit) => {
        commits.push(commit);
        // The guarded reply finds a stop requested: nothing is written.
        return Promise.resolve(commit.unlessChangedSince !== undefined ? { ...CONTROL, cancelRequestedByActorId: "bob" } : CONTROL);
      },
      readControl: () => Promise.resolve(CONTROL),
    } as unknown as RunStore;
    const batching = batchReadOutcomes(store, { flushAfterMs: 10_000 });
    await batching.commitToolOutcome(outcome("read-1", "read"));
    expect(await batching.commitStep({ ...step(2), status: "succeeded", unlessChangedSince: { triggerCount: 1 } })).toMatchObject({ cancelRequestedByActorId: "bob" });
    await batching.commitStep({ ...step(3), status: "cancelled" });
    expect(commits.map((c) => [c.status, ids(c.priorOutcomes)])).toEqual([
      ["succeeded", ["read-1"]],
      ["cancelled", ["read-1"]],
    ]);
    batching.close();
  });
});
