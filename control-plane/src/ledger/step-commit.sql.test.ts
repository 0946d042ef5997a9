// Which fenced commits wait for their WAL flush in each durability mode (README, "Durability").
import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "../domain/run.js";
import type { Settlement } from "../runner/run-store.js";
import { fencedBatchCommit, fencedBatchCommitFor, fencedHeldBatchCommit } from "./step-commit-batch.sql.js";
import { fencedCommitParams, type Durability } from "./step-commit-params.js";
import { fencedCommit, fencedCommitFor, fencedHeldCommit, type FencedChange } from "./step-commit.sql.js";

const FENCE = { runId: "00000000-0000-4000-8000-000000000001", workerId: "w", epoch: 1 };
const NOTHING: FencedChange = { step: undefined, outcomes: [], crossesCommitBoundary: false, writes: false, events: [], unlessChangedSince: undefined };

function settlement(extra: Partial<Settlement> = {}): Settlement {
  return { status: "running", usage: ZERO_USAGE, emissions: [], summary: "s", ...extra };
}

const waits = (durability: Durability, s: Settlement, change: FencedChange = NOTHING) => fencedCommitParams(FENCE, s, change, durability).synchronousCommit;

describe("fenced commit durability", () => {
  it("strict: every commit waits for its flush, replayable ones too", () => {
    expect(waits("strict", settlement())).toBe("on");
    expect(waits("strict", settlement({ status: "awaiting_tool" }))).toBe("on");
  });

  it("relaxed: only replayable work skips the wait", () => {
    expect(waits("relaxed", settlement())).toBe("off");
    expect(waits("relaxed", settlement({ status: "awaiting_tool" }))).toBe("off");
    expect(waits("relaxed", settlement(), { ...NOTHING, writes: true })).toBe("on");
    expect(waits("relaxed", settlement({ emissions: [{ idempotencyKey: "k", kind: "reply", text: "t", addressedActorIds: [] }] }))).toBe("on");
    expect(waits("relaxed", settlement({ status: "succeeded" }))).toBe("on");
    expect(waits("relaxed", settlement({ status: "awaiting_input" }))).toBe("on");
  });
});

describe("fenced commit shape", () => {
  const statementFor = (s: Settlement, change: FencedChange = NOTHING) => fencedCommitFor(fencedCommitParams(FENCE, s, change, "strict"));
  const artifact = { type: "note", schemaVersion: "1", provenance: "observed" as const, inlineData: "x" };

  it("a commit that keeps its lease and writes no artifact or emission takes the held statement", () => {
    expect(statementFor(settlement())).toBe(fencedHeldCommit);
    expect(statementFor(settlement({ status: "awaiting_tool" }))).toBe(fencedHeldCommit);
  });

  it("any other commit takes the statement with every part", () => {
    expect(statementFor(settlement({ status: "succeeded" }))).toBe(fencedCommit);
    expect(statementFor(settlement({ status: "queued" }))).toBe(fencedCommit);
    expect(statementFor(settlement({ emissions: [{ idempotencyKey: "k", kind: "progress", text: "t", addressedActorIds: [] }] }))).toBe(fencedCommit);
    const outcome = { invocationId: "00000000-0000-4000-8000-000000000002", effect: "read" as const, outcome: "succeeded" as const, resultText: "r", artifacts: [{ ...artifact, id: "00000000-0000-4000-8000-000000000003" }] };
    expect(statementFor(settlement(), { ...NOTHING, outcomes: [outcome] })).toBe(fencedCommit);
  });

  it("a batch takes the held statement only when every commit in it is held", () => {
    const held = fencedCommitParams(FENCE, settlement(), NOTHING, "strict");
    const settled = fencedCommitParams(FENCE, settlement({ status: "succeeded" }), NOTHING, "strict");
    expect(fencedBatchCommitFor([held, held])).toBe(fencedHeldBatchCommit);
    expect(fencedBatchCommitFor([held, settled])).toBe(fencedBatchCommit);
  });

  it("the held statements leave out the artifact and emission inserts and the wake-up test", () => {
    for (const full of [fencedCommit, fencedBatchCommit]) {
      expect(full.text).toMatch(/INSERT INTO artifacts/);
      expect(full.text).toMatch(/INSERT INTO emissions/);
    }
    for (const held of [fencedHeldCommit, fencedHeldBatchCommit]) expect(held.text).not.toMatch(/INSERT INTO artifacts|INSERT INTO emissions|q\.status = 'queued'/);
  });
});
