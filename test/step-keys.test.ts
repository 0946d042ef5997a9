// What holds a step's rows together now that a step's model call is on its row and side_model_calls,
// tool_invocations and observations keep a foreign key to their run only: the fenced commit writes
// the step, its model call and its calls
// together, a settled call's result is read back as its last observation (call_observations) without
// being stored twice, and a streamed observation stores nothing for a call its run does not have
// (and says so).
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { ZERO_USAGE } from "../control-plane/src/domain/run.js";
import { createRunRepository } from "../control-plane/src/ledger/run.repository.js";
import { createStepCommitRepository } from "../control-plane/src/ledger/step-commit.repository.js";
import type { InvocationIntent, StepCommit } from "../control-plane/src/runner/run-store.js";
import { seedHeldRun } from "./support/run-seed.js";
import { seededLedger } from "./support/seeded-ledger.js";

const OWNERS = { agent: "keys-agent", actor: "keys-actor", conversation: "00000000-0000-4000-8000-000000000003" };
const ledger = seededLedger(OWNERS);

const read = (ordinal: number): InvocationIntent => ({
  id: randomUUID(),
  providerCallId: `call-${ordinal}`,
  ordinal,
  toolName: "kv.read",
  toolVersion: "1",
  effect: "read",
  argumentsJson: "{}",
  status: "pending",
});

const stepWith = (index: number, invocations: readonly InvocationIntent[]): StepCommit["step"] => ({
  id: randomUUID(),
  index,
  replayability: "replayable",
  actorId: undefined,
  startedAt: new Date(),
  modelCall: {
    id: randomUUID(),
    role: "primary",
    provider: "scripted",
    model: "scripted",
    request: { messages: [], tools: [] },
    responseText: "",
    toolCalls: invocations.map((i) => ({ id: i.providerCallId, name: i.toolName, argumentsJson: i.argumentsJson })),
    inputTokens: 1,
    outputTokens: 1,
    latencyMs: 0,
    finishReason: "tool_calls",
    costMicroUsd: 0,
  },
  invocations,
});

async function foreignKeys(table: string): Promise<string[]> {
  const { rows } = await ledger.db.query<{ definition: string }>(
    "SELECT pg_get_constraintdef(oid) AS definition FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'f' ORDER BY 1",
    [table],
  );
  return rows.map((row) => row.definition);
}

describe("a step's rows", () => {
  it("keep a foreign key to their run, none to the step, model call or tool call written beside them", async () => {
    for (const table of ["side_model_calls", "tool_invocations", "observations"]) {
      expect(await foreignKeys(table)).toEqual([expect.stringMatching(/^FOREIGN KEY \(run_id\) REFERENCES runs\(id\)/)]);
    }
  });

  it("name the step, model call and call the same commit wrote, in batches and alone", async () => {
    const runs = [await seedHeldRun(ledger.db, OWNERS), await seedHeldRun(ledger.db, OWNERS), await seedHeldRun(ledger.db, OWNERS)];
    const repository = createStepCommitRepository(ledger.sql, "strict");
    const commit = async (runId: string) => {
      const base = { runId, workerId: "w", epoch: 1, usage: ZERO_USAGE, emissions: [] };
      const first = read(0);
      await repository.commitStep({ ...base, status: "awaiting_tool", step: stepWith(0, [first]), summary: "1 tool call(s)" });
      const second = [read(0), read(1)];
      await repository.commitStep({
        ...base,
        status: "awaiting_tool",
        step: stepWith(1, second),
        summary: "2 tool call(s)",
        priorOutcomes: [{ invocationId: first.id, effect: "read", outcome: "succeeded", resultText: "the value", artifacts: [] }],
      });
    };
    // At once, so some of them share a batch statement; the rest go alone.
    await Promise.all(runs.map(commit));

    const { rows } = await ledger.db.query<{ run_id: string; calls: number; matched_calls: number; invocations: number; matched_invocations: number; observations: number; matched_observations: number; stored_observations: number }>(
      `SELECT r.id AS run_id,
         (SELECT count(*)::int FROM model_calls m WHERE m.run_id = r.id) AS calls,
         (SELECT count(*)::int FROM model_calls m JOIN run_steps s ON s.id = m.step_id AND s.run_id = r.id WHERE m.run_id = r.id) AS matched_calls,
         (SELECT count(*)::int FROM tool_invocations i WHERE i.run_id = r.id) AS invocations,
         (SELECT count(*)::int FROM tool_invocations i JOIN run_steps s ON s.id = i.step_id AND s.run_id = r.id
            JOIN model_calls m ON m.id = i.model_call_id AND m.step_id = s.id WHERE i.run_id = r.id) AS matched_invocations,
         (SELECT count(*)::int FROM call_observations o WHERE o.run_id = r.id) AS observations,
         (SELECT count(*)::int FROM call_observations o JOIN tool_invocations i ON i.id = o.tool_invocation_id AND i.run_id = r.id
            WHERE o.run_id = r.id AND o.stream = 'result' AND o.text = i.result_text AND o.id = i.id) AS matched_observations,
         (SELECT count(*)::int FROM observations o WHERE o.run_id = r.id) AS stored_observations
       FROM runs r WHERE r.id = ANY($1::uuid[]) ORDER BY r.id`,
      [runs],
    );
    expect(rows).toHaveLength(3);
    for (const row of rows) {
      expect(row).toMatchObject({ calls: 2, matched_calls: 2, invocations: 3, matched_invocations: 3, observations: 1, matched_observations: 1 });
      // The result is read from its call, not stored a second time.
      expect(row.stored_observations).toBe(0);
    }
  });

  it("store a streamed observation only for a call of its run, and say why not otherwise", async () => {
    const runId = await seedHeldRun(ledger.db, OWNERS);
    const other = await seedHeldRun(ledger.db, OWNERS);
    const repository = createStepCommitRepository(ledger.sql, "strict");
    const mine = read(0);
    const theirs = read(0);
    await repository.commitStep({ runId, workerId: "w", epoch: 1, usage: ZERO_USAGE, emissions: [], status: "awaiting_tool", step: stepWith(0, [mine]), summary: "1" });
    await repository.commitStep({ runId: other, workerId: "w", epoch: 1, usage: ZERO_USAGE, emissions: [], status: "awaiting_tool", step: stepWith(0, [theirs]), summary: "1" });
    const store = createRunRepository(ledger.sql);
    const fence = { runId, workerId: "w", epoch: 1 };

    await store.observationLog(fence, mine.id).append("stdout", "line one\n");
    await expect(store.observationLog(fence, theirs.id).append("stdout", "not mine\n")).rejects.toThrow(
      `an observation names tool call ${theirs.id}, which run ${runId} does not have`,
    );
    await expect(store.observationLog(fence, randomUUID()).append("stdout", "no such call\n")).rejects.toThrow(/which run .* does not have/);
    // A lost lease is still told apart: the call is the run's, the lease is not.
    await expect(store.observationLog({ ...fence, epoch: 2 }, mine.id).append("stdout", "fenced out\n")).rejects.toBeInstanceOf(LeaseLostError);

    const { rows } = await ledger.db.query<{ tool_invocation_id: string; text: string }>("SELECT tool_invocation_id, text FROM observations WHERE run_id = ANY($1::uuid[]) ORDER BY seq", [
      [runId, other],
    ]);
    expect(rows).toEqual([{ tool_invocation_id: mine.id, text: "line one\n" }]);
  });
});
