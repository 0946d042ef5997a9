// Fenced commits of a run's steps and tool results: each one statement that writes only if the
// worker still holds the run's lease, and reads back the run's control state.
import { randomUUID } from "node:crypto";
import type { Policy } from "../domain/agent.js";
import { LeaseLostError } from "../domain/errors.js";
import { isTerminal, type RunStatus } from "../domain/run.js";
import { refusedReply, type ReplyGuard } from "../domain/settlement.js";
import type { Fence, RunControlState, RunStore, Settlement, StepCommit, ToolOutcome } from "../runner/run-store.js";
import { reserveEmissions, type RunEventDraft } from "./ledger-writes.js";
import { preparedRows, type Sql } from "./sql.js";

interface FencedRun {
  status: RunStatus;
  agent_id: string;
  conversation_id: string;
  connector: string;
  external_id: string;
}

/**
 * Whether a commit may skip waiting for its WAL flush. Only work that is safe to lose in a
 * database crash qualifies: no emission (a connector may read a row before it is durable),
 * no write intent or outcome (intent before effect), no settled run. A later synchronous
 * commit flushes the WAL before it, so at worst a database crash forgets a replayable step
 * or a read's result, which recovery handles as it handles a dead worker.
 */
function mayCommitAsync(settlement: Settlement, writes: boolean): boolean {
  return !writes && settlement.emissions.length === 0 && HELD.has(settlement.status);
}

/** What one fenced commit writes besides the run row. */
interface FencedChange {
  readonly step: StepCommit["step"];
  /** Results settled by this commit, in the order they finished. */
  readonly outcomes: readonly ToolOutcome[];
  readonly crossesCommitBoundary: boolean;
  /** A write intent or outcome: the commit must be durable before anything else happens. */
  readonly writes: boolean;
  readonly events: readonly RunEventDraft[];
  /** Write nothing if a stop is requested or the trigger count moved from the one given; see StepCommit.unlessChangedSince. */
  readonly unlessChangedSince: ReplyGuard | undefined;
}

/** Statuses in which a worker keeps its lease. */
const HELD: ReadonlySet<RunStatus> = new Set(["running", "awaiting_tool"]);

export function createStepCommitRepository(sql: Sql): Pick<RunStore, "commitStep" | "commitToolOutcome" | "readControl"> {
  /**
   * One fenced commit, as ONE statement: it locks the run row, checks the lease owner and
   * epoch, writes the run's new status, and inserts the step, intents, results, artifacts
   * and events only FROM the fence's row, so a worker that lost its lease matches nothing,
   * writes nothing and gets LeaseLostError. One statement is one round trip and its own
   * transaction; only a commit with emissions wraps it, to reserve them in the same one.
   */
  const commitFenced = async (fence: Fence, settlement: Settlement, change: FencedChange): Promise<RunControlState> => {
    const terminal = isTerminal(settlement.status);
    const keepsLease = HELD.has(settlement.status);
    const ctes: string[] = [];
    const bindings: unknown[] = [];
    const cte = (sqlText: string, ...values: unknown[]) => {
      ctes.push(sqlText);
      bindings.push(...values);
    };
    cte(`durability AS (SELECT set_config('synchronous_commit', ?, true) AS setting)`, mayCommitAsync(settlement, change.writes) ? "off" : "on");
    cte(`previous AS (SELECT id, status FROM runs WHERE id = ? FOR NO KEY UPDATE)`, fence.runId);
    cte(
      `fence AS (
         UPDATE runs r SET status = ?, usage = ?::jsonb, step_count = r.step_count + ?,
           final_reply = coalesce(?, r.final_reply), error = coalesce(?, r.error),
           exhausted_dimension = coalesce(?, r.exhausted_dimension), wait_reason = ?,
           commit_boundary = CASE WHEN ? THEN 'committed' ELSE r.commit_boundary END,
           updated_at = now(), finished_at = CASE WHEN ? THEN now() ELSE r.finished_at END,
           lease_owner = CASE WHEN ? THEN r.lease_owner ELSE NULL END,
           lease_expires_at = CASE WHEN ? THEN r.lease_expires_at ELSE NULL END,
           event_seq = r.event_seq + ? + CASE WHEN previous.status <> ? THEN 1 ELSE 0 END
         FROM previous, durability, conversations c, agents a
         WHERE r.id = previous.id AND c.id = r.conversation_id AND a.id = r.agent_id
           AND r.lease_epoch = ? AND r.lease_owner = ?
           AND (NOT ?::boolean OR (r.cancel_requested_by_actor_id IS NULL AND (?::int IS NULL OR r.trigger_count = ?::int)))
         RETURNING r.id, previous.status AS previous_status, r.event_seq, r.agent_id, r.conversation_id, r.connector,
           c.external_id, r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.trigger_count, r.paused,
           a.spec -> 'policy' AS policy)`,
      settlement.status,
      JSON.stringify(settlement.usage),
      change.step === undefined ? 0 : 1,
      settlement.finalReply ?? null,
      settlement.error ?? null,
      settlement.exhaustedDimension ?? null,
      settlement.waitReason ?? null,
      change.crossesCommitBoundary,
      terminal,
      keepsLease,
      keepsLease,
      change.events.length,
      settlement.status,
      fence.epoch,
      fence.workerId,
      change.unlessChangedSince !== undefined,
      change.unlessChangedSince?.triggerCount ?? null,
      change.unlessChangedSince?.triggerCount ?? null,
    );
    const step = change.step;
    if (step !== undefined) {
      cte(
        `new_step AS (
           INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, actor_id, feedback, lease_epoch, started_at)
           SELECT ?, fence.id, ?, ?, ?, ?, ?, ?, ? FROM fence)`,
        step.id, step.index, step.replayability, settlement.status, step.actorId ?? null, step.feedback ?? null, fence.epoch, step.startedAt,
      );
      const call = step.modelCall;
      if (call !== undefined) {
        cte(
          `new_call AS (
             INSERT INTO model_calls (id, run_id, step_id, role, provider, model, request, response_text, tool_calls,
               input_tokens, output_tokens, latency_ms, finish_reason, cost_micro_usd)
             SELECT ?, fence.id, ?, ?, ?, ?, ?::jsonb, ?, ?::jsonb, ?, ?, ?, ?, ? FROM fence)`,
          call.id, step.id, call.role, call.provider, call.model, JSON.stringify(call.request), call.responseText,
          JSON.stringify(call.toolCalls), call.inputTokens, call.outputTokens, call.latencyMs, call.finishReason, call.costMicroUsd,
        );
      }
      if (step.invocations.length > 0) {
        cte(
          `new_intents AS (
             INSERT INTO tool_invocations (id, run_id, step_id, model_call_id, provider_call_id, ordinal, tool_name, tool_version,
               effect, arguments, status, refusal_reason, finished_at)
             SELECT x.id, fence.id, ?, ?, x.provider_call_id, x.ordinal, x.tool_name, x.tool_version, x.effect, x.arguments,
               x.status, x.refusal_reason, CASE WHEN x.status = 'refused' THEN now() END
             FROM fence, jsonb_to_recordset(?::jsonb) AS x(id uuid, provider_call_id text, ordinal int, tool_name text,
               tool_version text, effect text, arguments jsonb, status text, refusal_reason text))`,
          step.id,
          call?.id ?? null,
          JSON.stringify(
            step.invocations.map((intent) => ({
              id: intent.id,
              provider_call_id: intent.providerCallId,
              ordinal: intent.ordinal,
              tool_name: intent.toolName,
              tool_version: intent.toolVersion,
              effect: intent.effect,
              arguments: JSON.parse(asJsonb(intent.argumentsJson)) as unknown,
              status: intent.status,
              refusal_reason: intent.refusalReason ?? null,
            })),
          ),
        );
      }
    }
    const outcomes = change.outcomes;
    if (outcomes.length > 0) {
      cte(
        `settled AS (
           UPDATE tool_invocations t SET status = x.outcome, result_text = x.result_text, refusal_reason = coalesce(x.refusal_reason, t.refusal_reason),
             exit_code = x.exit_code, duration_ms = x.duration_ms, output_truncated = x.truncated, finished_at = now(),
             resolved_by_actor_id = coalesce(x.answered_by, t.resolved_by_actor_id), resolved_outcome = coalesce(x.resolved_outcome, t.resolved_outcome)
           FROM fence, jsonb_to_recordset(?::jsonb) AS x(id uuid, outcome text, result_text text, refusal_reason text, exit_code int,
             duration_ms int, truncated boolean, answered_by text, resolved_outcome text, observation_id uuid)
           WHERE t.id = x.id AND t.run_id = fence.id
           RETURNING t.id, x.outcome, x.result_text, x.truncated, x.observation_id),
         result_observation AS (
           INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text, truncated)
           SELECT s.observation_id, fence.id, s.id, (SELECT coalesce(max(o.seq), 0) + 1 FROM observations o WHERE o.tool_invocation_id = s.id),
             'result', s.result_text, s.truncated
           FROM fence, settled s WHERE s.result_text <> '' AND s.outcome <> 'refused')`,
        // The whole result is an observation too (observation_id), so compaction can point at it.
        JSON.stringify(
          outcomes.map((outcome) => ({
            id: outcome.invocationId,
            outcome: outcome.outcome,
            result_text: outcome.resultText,
            refusal_reason: outcome.refusalReason ?? null,
            exit_code: outcome.exitCode ?? null,
            duration_ms: outcome.durationMs ?? null,
            truncated: outcome.truncated ?? false,
            answered_by: outcome.answeredByActorId ?? null,
            resolved_outcome: outcome.resolvedOutcome ?? null,
            observation_id: randomUUID(),
          })),
        ),
      );
      const artifacts = outcomes.flatMap((outcome) => outcome.artifacts.map((artifact) => ({ ...artifact, invocationId: outcome.invocationId })));
      if (artifacts.length > 0) {
        cte(
          `new_artifacts AS (
             INSERT INTO artifacts (id, run_id, tool_invocation_id, type, schema_version, provenance, inline_data, reference,
               subject_artifact_id, conclusion)
             SELECT x.id, fence.id, x.tool_invocation_id, x.type, x.schema_version, x.provenance, x.inline_data, x.reference,
               x.subject_artifact_id, x.conclusion
             FROM fence, jsonb_to_recordset(?::jsonb) AS x(id uuid, tool_invocation_id uuid, type text, schema_version text, provenance text,
               inline_data text, reference text, subject_artifact_id uuid, conclusion text))`,
          JSON.stringify(
            artifacts.map((artifact) => ({
              id: artifact.id,
              tool_invocation_id: artifact.invocationId,
              type: artifact.type,
              schema_version: artifact.schemaVersion,
              provenance: artifact.provenance,
              inline_data: artifact.inlineData ?? null,
              reference: artifact.reference ?? null,
              subject_artifact_id: artifact.subjectArtifactId ?? null,
              conclusion: artifact.conclusion ?? null,
            })),
          ),
        );
      }
    }
    // The status change is the last event, numbered only when the status did change.
    const events = [...change.events.map((event) => ({ ...event, onlyOnChange: false })), { kind: "status_changed" as const, status: settlement.status, summary: settlement.summary, onlyOnChange: true }];
    cte(
      `new_events AS (
         INSERT INTO run_events (run_id, seq, kind, status, step_id, tool_invocation_id, summary)
         SELECT fence.id, fence.event_seq - count(*) OVER () + row_number() OVER (ORDER BY e.ord), e.kind, e.status, e.step_id,
           e.tool_invocation_id, e.summary
         FROM fence, jsonb_to_recordset(?::jsonb) AS e(ord int, kind text, status text, step_id uuid, tool_invocation_id uuid,
           summary text, only_on_change boolean)
         WHERE NOT e.only_on_change OR fence.previous_status <> ?)`,
      JSON.stringify(
        events.map((event, ord) => ({
          ord,
          kind: event.kind,
          status: event.status ?? null,
          step_id: event.stepId ?? null,
          tool_invocation_id: event.toolInvocationId ?? null,
          summary: event.summary,
          only_on_change: event.onlyOnChange,
        })),
      ),
      settlement.status,
    );
    const statement = `WITH ${ctes.join(",\n")}
      SELECT fence.*, pg_notify('keel_run_events', fence.id::text) AS notified,
        CASE WHEN ? OR (? AND EXISTS (SELECT 1 FROM runs q WHERE q.status = 'queued' AND NOT q.paused))
          THEN pg_notify('keel_runs', fence.id::text) END AS woken
      FROM fence`;
    // A run handed back (answered, resolved) wakes a worker; so does one that gives up its
    // worker slot (settled, parked) while others wait: one held back by its conversation or a
    // ceiling may go now. With nothing queued, no worker is woken for an empty claim.
    bindings.push(settlement.status === "queued", !keepsLease);

    type FenceRow = FencedRun & ControlRow & { id: string };
    const apply = async (executor: Sql): Promise<FenceRow | undefined> => {
      const [run] = await preparedRows<FenceRow>(executor, statement, bindings);
      return run;
    };
    const run =
      settlement.emissions.length === 0
        ? await apply(sql)
        : await sql.transaction(async (trx) => {
            const fenced = await apply(trx);
            if (fenced === undefined) return undefined;
            await reserveEmissions(
              trx,
              { runId: fence.runId, agentId: fenced.agent_id, conversationId: fenced.conversation_id, externalConversationId: fenced.external_id, connector: fenced.connector },
              settlement.emissions,
            );
            return fenced;
          });
    if (run !== undefined) return toControlState(run);
    if (change.unlessChangedSince !== undefined) {
      // Matched nothing: the guard held it back, or the lease is gone. Nothing was written either way.
      const [held] = await preparedRows<ControlRow>(sql, `${CONTROL_OF_RUN} AND r.lease_epoch = ? AND r.lease_owner = ?`, [fence.runId, fence.epoch, fence.workerId]);
      const control = held === undefined ? undefined : toControlState(held);
      if (control !== undefined && refusedReply(change.unlessChangedSince, control)) return control;
    }
    throw new LeaseLostError(fence.runId, fence.epoch);
  };

  return {
    commitStep: (commit) => {
      const step = commit.step;
      const prior = commit.priorOutcomes ?? [];
      const events: RunEventDraft[] = settledEvents(prior);
      if (step !== undefined) {
        for (const intent of step.invocations) {
          events.push({
            kind: intent.status === "refused" ? "tool_settled" : "tool_invoked",
            toolInvocationId: intent.id,
            stepId: step.id,
            summary: intent.status === "refused" ? `${intent.toolName} refused: ${intent.refusalReason ?? ""}` : `${intent.toolName} intent recorded`,
          });
        }
        events.push({ kind: "step_committed", stepId: step.id, status: commit.status, summary: `step ${step.index}: ${commit.summary}` });
      }
      return commitFenced(commit, commit, {
        step,
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
        events: settledEvents(outcomes),
        unlessChangedSince: undefined,
      });
    },

    async readControl(runId) {
      const [row] = await preparedRows<ControlRow>(sql, CONTROL_OF_RUN, [runId]);
      if (row === undefined) throw new Error(`run ${runId} vanished`);
      return toControlState(row);
    },

  };
}

const CONTROL_OF_RUN = `SELECT r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.paused, r.trigger_count, a.spec -> 'policy' AS policy
  FROM runs r JOIN agents a ON a.id = r.agent_id WHERE r.id = ?`;

/** What a fenced commit and readControl read back of a run's control state. */
interface ControlRow {
  cancel_requested_by_actor_id: string | null;
  superseded_by_run_id: string | null;
  paused: boolean;
  trigger_count: number;
  policy: Policy;
}

function toControlState(row: ControlRow): RunControlState {
  return {
    cancelRequestedByActorId: row.cancel_requested_by_actor_id ?? undefined,
    supersededByRunId: row.superseded_by_run_id ?? undefined,
    paused: row.paused,
    policy: row.policy,
    triggerCount: Number(row.trigger_count),
  };
}

function settledEvents(outcomes: readonly ToolOutcome[]): RunEventDraft[] {
  return outcomes.map((outcome) => ({
    kind: "tool_settled",
    toolInvocationId: outcome.invocationId,
    summary: `${outcome.outcome}: ${outcome.resultText.slice(0, 120)}`,
  }));
}

/**
 * The arguments column is jsonb, but a refused call keeps what the model sent, which may not be
 * JSON at all ("the arguments are not valid JSON"): such text is stored as a JSON string.
 */
function asJsonb(argumentsJson: string): string {
  try {
    JSON.parse(argumentsJson);
    return argumentsJson;
  } catch {
    return JSON.stringify(argumentsJson);
  }
}

