// Fenced commits of a run's steps and tool results: each one statement that writes only if the
// worker still holds the run's lease, and reads back the run's control state.
import { LeaseLostError } from "../domain/errors.js";
import { refusedReply } from "../domain/settlement.js";
import { sideUsageOf } from "../domain/triage.js";
import type { RunStatus } from "../domain/run.js";
import type { Fence, RunControlState, RunStore, Settlement } from "../runner/run-store.js";
import type { RunEventDraft } from "./ledger-writes.js";
import type { Sql } from "./sql.js";
import {
  controlOfHeldRun,
  controlOfRun,
  fencedCommit,
  fencedCommitFor,
  type ControlRow,
  type FenceRow,
  type FencedChange,
  type FencedCommitParams,
} from "./step-commit.sql.js";
import { fencedCommitParams, type Durability } from "./step-commit-params.js";
import { DEFAULT_GROUP_COMMIT, groupCommits, type GroupCommitOptions } from "./group-commit.js";
import { fencedBatchCommitFor, fencedBatchParams } from "./step-commit-batch.sql.js";
import { createToolSets } from "./tool-sets.js";

/** Runs whose last status this process remembers at most (createStepCommitRepository's lastStatus). */
const LAST_STATUS_LIMIT = 10_000;

/** How long a batch of commits waits for a row lock before its commits are retried one by one. */
const BATCH_LOCK_TIMEOUT_MS = 100;

export function createStepCommitRepository(
  sql: Sql,
  durability: Durability,
  grouping: GroupCommitOptions = DEFAULT_GROUP_COMMIT,
): Pick<RunStore, "commitStep" | "commitToolOutcome" | "readControl"> {
  const toolSets = createToolSets(sql);
  /**
   * The status each run this process holds was left in by its last commit here, so a commit that
   * keeps it and carries no event can skip the events insert. Only a hint: the statement checks
   * it. Entries go when a run's lease is given up or a commit fails; the cap bounds what runs
   * whose leases were lost without a commit here can leave.
   */
  const lastStatus = new Map<string, RunStatus>();
  /**
   * Runs' commits that arrive while others are being written go together (group-commit.ts): as
   * one set-oriented statement (step-commit-batch.sql.ts), each commit fenced on its own, in one
   * transaction that flushes once. It waits for its WAL flush if any of them must.
   */
  const write = groupCommits<FencedCommitParams, FenceRow>(
    {
      together: async (batch) => {
        const synchronousCommit = batch.some((params) => params.synchronousCommit === "on") ? "on" : "off";
        const options = { plans: "generic", lockTimeoutMs: BATCH_LOCK_TIMEOUT_MS } as const;
        // A run's commits wait for each other, so a batch holds each run once; if one ever came
        // twice, the set form could not tell its commits apart, and they go one statement each.
        if (new Set(batch.map((params) => params.runId)).size < batch.length) {
          const statements = batch.map((params) => ({ ...params, synchronousCommit }) as const);
          return sql.transaction((trx) => trx.runEachLast(fencedCommit, statements), undefined, options);
        }
        const rows = await sql.transaction((trx) => trx.runLast(fencedBatchCommitFor(batch), fencedBatchParams(batch, synchronousCommit)), undefined, options);
        const byCommit = new Map(rows.map((row) => [Number(row.ord), row]));
        return batch.map((_, ord) => {
          const row = byCommit.get(ord);
          return row === undefined ? [] : [row];
        });
      },
      alone: (params) => sql.transaction((trx) => trx.runLast(fencedCommitFor(params), params), undefined, { plans: "generic" }),
      waitsForFlush: (params) => params.synchronousCommit === "on",
    },
    grouping,
  );

  /**
   * One fenced commit, as ONE statement (step-commit.sql.ts), its emissions included: a worker
   * that lost its lease matches nothing, writes nothing and gets LeaseLostError. It goes out in one
   * round trip with its BEGIN and COMMIT, so no lock is held while this process is busy elsewhere.
   * Its one generic plan serves every commit: left to choose, PostgreSQL planned it afresh each
   * time, 0.6 ms of its CPU per commit (ledger-statements.test.ts checks the generic plan).
   */
  const commitFenced = async (fence: Fence, settlement: Settlement, change: FencedChange): Promise<RunControlState> => {
    const request = change.step?.modelCall?.request;
    const requestJson = request === undefined ? undefined : await toolSets.requestJson(request);
    const statusKept = lastStatus.get(fence.runId) === settlement.status;
    lastStatus.delete(fence.runId);
    const params = fencedCommitParams(fence, settlement, { ...change, requestJson, statusKept }, durability);
    // A quiet commit (fencedQuietCommit) writes nothing if the status moved after all; it is then
    // made again with the statement that records the change (or finds the lease gone).
    let [run] = await write(params);
    if (run === undefined && params.storesNoEvent) [run] = await write({ ...params, storesNoEvent: false });
    if (run !== undefined && params.keepsLease) {
      if (lastStatus.size >= LAST_STATUS_LIMIT) lastStatus.clear();
      lastStatus.set(fence.runId, settlement.status);
    }
    if (run !== undefined) {
      sql.notify("keel_run_events", fence.runId);
      if (run.emitted > 0) sql.notify("keel_emissions", run.connector);
      if (run.woken) sql.notify("keel_runs", fence.runId);
      return toControlState(run);
    }
    if (change.unlessChangedSince !== undefined) {
      // Matched nothing: the guard held it back, or the lease is gone. Nothing was written either way.
      const [held] = await sql.run(controlOfHeldRun, fence);
      const control = held === undefined ? undefined : toControlState(held);
      if (control !== undefined && refusedReply(change.unlessChangedSince, control)) return control;
    }
    throw new LeaseLostError(fence.runId, fence.epoch);
  };

  return {
    commitStep: (commit) => {
      const step = commit.step;
      const prior = commit.priorOutcomes ?? [];
      // The settled calls' events and the step's are read from their rows (run_event_feed); only
      // a refused call's, settled here with no result of its own, is a row of run_events.
      const events: RunEventDraft[] = [];
      let stepSummary: string | undefined;
      if (step !== undefined) {
        // The step's event names the calls it records: a tool_invoked event a call would only say
        // the same again, one more row, index entry and key check per call on the hottest path.
        const invoked = step.invocations.filter((intent) => intent.status !== "refused").map((intent) => intent.toolName);
        for (const intent of step.invocations) {
          if (intent.status !== "refused") continue;
          events.push({ kind: "tool_settled", toolInvocationId: intent.id, stepId: step.id, summary: `${intent.toolName} refused: ${intent.refusalReason ?? ""}` });
        }
        const calls = invoked.length === 0 ? "" : ` (${invoked.join(", ")})`;
        stepSummary = `step ${step.index}: ${commit.summary}${calls}`;
      }
      return commitFenced(commit, commit, {
        step,
        stepSummary,
        outcomes: prior,
        crossesCommitBoundary: commit.crossesCommitBoundary ?? false,
        writes: step?.invocations.some((intent) => intent.effect === "write" && intent.status === "pending") ?? false,
        events,
        unlessChangedSince: commit.unlessChangedSince,
      });
    },

    commitToolOutcome: (commit) => {
      const outcomes = [...(commit.priorOutcomes ?? []), commit];
      return commitFenced(commit, commit, {
        step: undefined,
        outcomes,
        crossesCommitBoundary: false,
        writes: commit.effect === "write",
        events: [],
        unlessChangedSince: undefined,
      });
    },

    async readControl(runId) {
      const [row] = await sql.run(controlOfRun, { runId });
      if (row === undefined) throw new Error(`run ${runId} vanished`);
      return toControlState(row);
    },
  };
}

function toControlState(row: ControlRow): RunControlState {
  return {
    cancelRequestedByActorId: row.cancel_requested_by_actor_id ?? undefined,
    supersededByRunId: row.superseded_by_run_id ?? undefined,
    paused: row.paused,
    policy: row.policy,
    triggerCount: Number(row.trigger_count),
    sideUsage: sideUsageOf(row.side_usage),
  };
}
