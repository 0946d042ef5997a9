// The events a step commit writes for WatchRun: one step_committed naming the calls it records
// (no tool_invoked row per call, which only said the same again), a tool_settled for each result
// and each refusal. run_events keeps its foreign key to the run only.
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "../control-plane/src/domain/run.js";
import { createStepCommitRepository } from "../control-plane/src/ledger/step-commit.repository.js";
import type { InvocationIntent, StepCommit } from "../control-plane/src/runner/run-store.js";
import { seedHeldRun } from "./support/run-seed.js";
import { seededLedger } from "./support/seeded-ledger.js";

const OWNERS = { agent: "ev-agent", actor: "ev-actor", conversation: "00000000-0000-4000-8000-000000000002" };
const ledger = seededLedger(OWNERS);

const intent = (toolName: string, status: "pending" | "refused", ordinal: number): InvocationIntent => ({
  id: randomUUID(),
  providerCallId: `call-${ordinal}`,
  ordinal,
  toolName,
  toolVersion: "1",
  effect: "read",
  argumentsJson: "{}",
  status,
  ...(status === "refused" ? { refusalReason: "not allowed" } : {}),
});

describe("a step commit's run events", () => {
  it("name the step's calls on its step_committed event, and settle each result and refusal", async () => {
    const runId = await seedHeldRun(ledger.db, OWNERS);
    const repository = createStepCommitRepository(ledger.sql, "strict");
    const [read, refused] = [intent("kv.read", "pending", 0), intent("kv.write", "refused", 1)];
    const step = (index: number, invocations: readonly InvocationIntent[]): StepCommit["step"] => ({
      id: randomUUID(),
      index,
      replayability: "replayable",
      actorId: undefined,
      startedAt: new Date(),
      modelCall: undefined,
      invocations,
    });
    const base = { runId, workerId: "w", epoch: 1, status: "running" as const, usage: ZERO_USAGE, emissions: [] };
    await repository.commitStep({ ...base, step: step(0, [read, refused]), summary: "2 tool call(s)" });
    // The read's result rides on the next step's commit, as the runner batches reads.
    await repository.commitStep({
      ...base,
      step: step(1, []),
      priorOutcomes: [{ invocationId: read.id, effect: "read", outcome: "succeeded", resultText: "v", artifacts: [] }],
      summary: "replied",
    });

    const { rows } = await ledger.db.query<{ seq: number; kind: string; tool_invocation_id: string | null; summary: string }>(
      "SELECT seq, kind, tool_invocation_id, summary FROM run_events WHERE run_id = $1 ORDER BY seq",
      [runId],
    );
    expect(rows.map((row) => [row.seq, row.kind, row.tool_invocation_id])).toEqual([
      [1, "tool_settled", refused.id],
      [2, "step_committed", null],
      [3, "tool_settled", read.id],
      [4, "step_committed", null],
    ]);
    expect(rows[0]?.summary).toBe("kv.write refused: not allowed");
    expect(rows[1]?.summary).toBe("step 0: 2 tool call(s) (kv.read)");
    expect(rows[3]?.summary).toBe("step 1: replied");
    const { rows: run } = await ledger.db.query<{ event_seq: number }>("SELECT event_seq FROM runs WHERE id = $1", [runId]);
    expect(run[0]?.event_seq).toBe(4);
  });

  it("keep a foreign key to their run and none to the steps and calls written beside them", async () => {
    const { rows } = await ledger.db.query<{ definition: string }>(
      "SELECT pg_get_constraintdef(oid) AS definition FROM pg_constraint WHERE conrelid = 'run_events'::regclass AND contype = 'f'",
    );
    expect(rows.map((row) => row.definition)).toEqual([expect.stringMatching(/^FOREIGN KEY \(run_id\) REFERENCES runs\(id\)/)]);
  });
});
