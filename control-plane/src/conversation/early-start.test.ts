import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "../domain/run.js";
import type { ClaimedRun } from "../runner/run-store.js";
import { EarlyStart } from "./early-start.js";
import { ClaimNotStarted } from "../domain/run-start.js";
import type { ReservedWorker } from "./worker-handoff.js";

function fakeWorker() {
  const seen: { started?: { claimed: ClaimedRun; committed: Promise<void> }; released: number } = { released: 0 };
  const worker: ReservedWorker = {
    workerId: "w1",
    leaseMs: 3000,
    start: (claimed, committed) => (seen.started = { claimed, committed }),
    release: () => seen.released++,
  };
  return { worker, seen };
}

const claim = { runId: "r1", epoch: 1, stepCount: 0, usage: ZERO_USAGE } as unknown as ClaimedRun;
const outcome = (p: Promise<void>) => p.then(() => "committed", (error: unknown) => error);

describe("EarlyStart", () => {
  it("hands the run over at once and lets the worker's ledger calls go on when the admission commits", async () => {
    const { worker, seen } = fakeWorker();
    const start = new EarlyStart(worker);
    start.handOver(claim);
    expect(seen.started?.claimed).toBe(claim);
    start.committed();
    expect(await outcome(seen.started!.committed)).toBe("committed");
    expect(seen.released).toBe(0);
  });

  it("tells a handed-over worker the run was queued behind a ceiling instead", async () => {
    const { worker, seen } = fakeWorker();
    const start = new EarlyStart(worker);
    start.handOver(claim);
    start.notStarted("r1");
    start.committed(); // the admission still commits its queued run: the worker stays told
    const error = await outcome(seen.started!.committed);
    expect(error).toBeInstanceOf(ClaimNotStarted);
    expect((error as ClaimNotStarted).runId).toBe("r1");
  });

  it("passes a failed admission on to a handed-over worker", async () => {
    const { worker, seen } = fakeWorker();
    const start = new EarlyStart(worker);
    start.handOver(claim);
    start.failed(new Error("commit failed"));
    expect(await outcome(seen.started!.committed)).toMatchObject({ message: "commit failed" });
  });

  it("releases a worker never handed a run, exactly once, whatever ends the admission", () => {
    for (const end of ["committed", "failed", "notStarted"] as const) {
      const { worker, seen } = fakeWorker();
      const start = new EarlyStart(worker);
      if (end === "committed") start.committed();
      else if (end === "failed") start.failed(new Error("x"));
      else start.notStarted("r1");
      start.committed();
      expect(seen.started, end).toBeUndefined();
      expect(seen.released, end).toBe(1);
    }
  });

  it("refuses to hand one worker two runs", () => {
    const { worker } = fakeWorker();
    const start = new EarlyStart(worker);
    start.handOver(claim);
    expect(() => start.handOver(claim)).toThrow(/cannot be handed run r1/);
  });
});
