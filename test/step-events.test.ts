// The events a step commit gives WatchRun: one step_committed naming the calls it records (no
// tool_invoked per call, which only said the same again), a tool_settled for each result and each
// refusal. The step's event and each result's are read from the step and call rows through
// run_event_feed, numbered among the rest; only the refusal is a row of run_events, which keeps its
// foreign key to the run only.
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "../control-plane/src/domain/run.js";
import { createStepCommitRepository } from "../control-plane/src/ledger/step-commit.repository.js";
import { createRunQueryRepository } from "../control-plane/src/ledger/run-query.repository.js";
import type { Sql } from "../control-plane/src/ledger/sql.js";
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

    const { rows } = await ledger.db.query<{ seq: number; kind: string; status: string | null; on_step: boolean; tool_invocation_id: string | null; summary: string }>(
      "SELECT seq, kind, status, step_id IS NOT NULL AS on_step, tool_invocation_id, summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq",
      [runId],
    );
    expect(rows.map((row) => [row.seq, row.kind, row.status, row.on_step, row.tool_invocation_id, row.summary])).toEqual([
      [1, "tool_settled", null, true, refused.id, "kv.write refused: not allowed"],
      [2, "step_committed", "running", true, null, "step 0: 2 tool call(s) (kv.read)"],
      [3, "tool_settled", null, false, read.id, "succeeded: v"],
      [4, "step_committed", "running", true, null, "step 1: replied"],
    ]);
    const stored = await ledger.db.query<{ seq: number }>("SELECT seq FROM run_events WHERE run_id = $1 ORDER BY seq", [runId]);
    expect(stored.rows.map((row) => row.seq)).toEqual([1]);
    const { rows: run } = await ledger.db.query<{ event_seq: number }>("SELECT event_seq FROM runs WHERE id = $1", [runId]);
    expect(run[0]?.event_seq).toBe(4);
    // WatchRun's reader pages through the same feed.
    const queries = createRunQueryRepository(ledger.sql);
    const page = await queries.eventsAfter(runId, 1, 2);
    expect(page.map((event) => [event.seq, event.kind])).toEqual([
      [2, "step_committed"],
      [3, "tool_settled"],
    ]);
  });

  it("number a result settled on its own and a status change after the step's event, with no gap", async () => {
    const runId = await seedHeldRun(ledger.db, OWNERS);
    const repository = createStepCommitRepository(ledger.sql, "strict");
    const write: InvocationIntent = { ...intent("kv.write", "pending", 0), effect: "write" };
    const base = { runId, workerId: "w", epoch: 1, usage: ZERO_USAGE, emissions: [] };
    await repository.commitStep({
      ...base,
      status: "awaiting_tool",
      step: { id: randomUUID(), index: 0, replayability: "not_replayable", actorId: undefined, startedAt: new Date(), modelCall: undefined, invocations: [write] },
      summary: "1 tool call(s) to dispatch",
    });
    const long = "x".repeat(300);
    await repository.commitToolOutcome({ ...base, status: "running", invocationId: write.id, effect: "write", outcome: "failed", resultText: long, artifacts: [], summary: "kv.write failed" });

    const { rows } = await ledger.db.query<{ seq: number; kind: string; status: string | null; summary: string }>(
      "SELECT seq, kind, status, summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq",
      [runId],
    );
    expect(rows.map((row) => [row.seq, row.kind, row.status, row.summary])).toEqual([
      [1, "step_committed", "awaiting_tool", "step 0: 1 tool call(s) to dispatch (kv.write)"],
      [2, "status_changed", "awaiting_tool", "1 tool call(s) to dispatch"],
      [3, "tool_settled", null, `failed: ${long.slice(0, 120)}`],
      [4, "status_changed", "running", "kv.write failed"],
    ]);
    const { rows: run } = await ledger.db.query<{ event_seq: number }>("SELECT event_seq FROM runs WHERE id = $1", [runId]);
    expect(run[0]?.event_seq).toBe(4);
  });

  it("skip the events insert while the status holds, and still record a change made meanwhile elsewhere", async () => {
    const runId = await seedHeldRun(ledger.db, OWNERS);
    // Which statement each commit went out as.
    const sent: string[] = [];
    const spied: Sql = {
      ...ledger.sql,
      transaction: (work, keep, options) =>
        ledger.sql.transaction((trx) => work({ ...trx, runLast: (statement, params) => (sent.push(statement.name), trx.runLast(statement, params)) }), keep, options),
    };
    const repository = createStepCommitRepository(spied, "strict");
    const base = { runId, workerId: "w", epoch: 1, status: "running" as const, usage: ZERO_USAGE, emissions: [] };
    const step = (index: number): StepCommit["step"] => ({
      id: randomUUID(), index, replayability: "replayable", actorId: undefined, startedAt: new Date(), modelCall: undefined, invocations: [],
    });
    await repository.commitStep({ ...base, step: step(0), summary: "thought" });
    await repository.commitStep({ ...base, step: step(1), summary: "thought again" });
    // Another process moves the run's status; this one still believes it is running.
    await ledger.db.query("UPDATE runs SET status = 'awaiting_input' WHERE id = $1", [runId]);
    await repository.commitStep({ ...base, step: step(2), summary: "back to work" });
    expect(sent).toEqual(["keel_step_commit_held", "keel_step_commit_quiet", "keel_step_commit_quiet", "keel_step_commit_held"]);

    const { rows } = await ledger.db.query<{ seq: number; kind: string; status: string | null }>(
      "SELECT seq, kind, status FROM run_event_feed WHERE run_id = $1 ORDER BY seq",
      [runId],
    );
    expect(rows.map((row) => [row.seq, row.kind, row.status])).toEqual([
      [1, "step_committed", "running"],
      [2, "step_committed", "running"],
      [3, "step_committed", "running"],
      [4, "status_changed", "running"],
    ]);
    const { rows: run } = await ledger.db.query<{ event_seq: number; step_count: number }>("SELECT event_seq, step_count FROM runs WHERE id = $1", [runId]);
    expect(run[0]).toMatchObject({ event_seq: 4, step_count: 3 });
  });

  it("keep a foreign key to their run and none to the steps and calls written beside them", async () => {
    const { rows } = await ledger.db.query<{ definition: string }>(
      "SELECT pg_get_constraintdef(oid) AS definition FROM pg_constraint WHERE conrelid = 'run_events'::regclass AND contype = 'f'",
    );
    expect(rows.map((row) => row.definition)).toEqual([expect.stringMatching(/^FOREIGN KEY \(run_id\) REFERENCES runs\(id\)/)]);
  });
});
