import { randomUUID } from "node:crypto";
import type { AgentSpec, Policy } from "../domain/agent.js";
import { LeaseLostError } from "../domain/errors.js";
import { isTerminal, ZERO_USAGE, type RunStatus, type RunUsage } from "../domain/run.js";
import type { ToolCallRequest } from "../domain/transcript.js";
import type {
  ClaimedRun,
  Fence,
  InvocationState,
  RunHistory,
  RunInputMessage,
  RunControlState,
  RunStore,
  Settlement,
  StepCommit,
  ToolOutcomeCommit,
  StepState,
} from "../runner/run-store.js";
import { appendRunEvents, reserveEmissions, type RunEventDraft } from "./ledger-writes.js";
import { toArtifactRecord } from "./row-mapping.js";
import { asDate, optional, rows, type Sql, type SqlTransaction } from "./sql.js";

interface ClaimRow {
  id: string;
  status: RunStatus;
  previous_status: RunStatus;
  lease_epoch: string;
  step_count: number;
  usage: Partial<RunUsage>;
  started_at: Date;
  connector: string;
  cancel_requested_by_actor_id: string | null;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  spec: AgentSpec;
}

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
  readonly outcome: ToolOutcomeCommit | undefined;
  readonly crossesCommitBoundary: boolean;
  /** A write intent or outcome: the commit must be durable before anything else happens. */
  readonly writes: boolean;
  readonly events: readonly RunEventDraft[];
}

/** Statuses in which a worker keeps its lease. */
const HELD: ReadonlySet<RunStatus> = new Set(["running", "awaiting_tool"]);

export function createRunRepository(sql: Sql): RunStore {
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
    cte(`previous AS (SELECT id, status FROM runs WHERE id = ? FOR UPDATE)`, fence.runId);
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
         RETURNING r.id, previous.status AS previous_status, r.event_seq, r.agent_id, r.conversation_id, r.connector,
           c.external_id, r.cancel_requested_by_actor_id, r.paused, a.spec -> 'policy' AS policy)`,
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
    const outcome = change.outcome;
    if (outcome !== undefined) {
      cte(
        `settled AS (
           UPDATE tool_invocations t SET status = ?, result_text = ?, refusal_reason = coalesce(?, t.refusal_reason),
             exit_code = ?, duration_ms = ?, output_truncated = ?, finished_at = now(),
             resolved_by_actor_id = coalesce(?, t.resolved_by_actor_id), resolved_outcome = coalesce(?, t.resolved_outcome)
           FROM fence WHERE t.id = ? AND t.run_id = fence.id RETURNING t.id)`,
        outcome.outcome, outcome.resultText, outcome.refusalReason ?? null, outcome.exitCode ?? null, outcome.durationMs ?? null,
        outcome.truncated ?? false, outcome.answeredByActorId ?? null, outcome.resolvedOutcome ?? null, outcome.invocationId,
      );
      // The whole result is an observation too, so compaction can point at it.
      if (outcome.resultText !== "" && outcome.outcome !== "refused") {
        cte(
          `result_observation AS (
             INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text, truncated)
             SELECT ?, fence.id, settled.id, (SELECT coalesce(max(seq), 0) + 1 FROM observations WHERE tool_invocation_id = ?), 'result', ?, ?
             FROM fence, settled)`,
          randomUUID(), outcome.invocationId, outcome.resultText, outcome.truncated ?? false,
        );
      }
      if (outcome.artifacts.length > 0) {
        cte(
          `new_artifacts AS (
             INSERT INTO artifacts (id, run_id, tool_invocation_id, type, schema_version, provenance, inline_data, reference,
               subject_artifact_id, conclusion)
             SELECT x.id, fence.id, ?, x.type, x.schema_version, x.provenance, x.inline_data, x.reference, x.subject_artifact_id, x.conclusion
             FROM fence, jsonb_to_recordset(?::jsonb) AS x(id uuid, type text, schema_version text, provenance text,
               inline_data text, reference text, subject_artifact_id uuid, conclusion text))`,
          outcome.invocationId,
          JSON.stringify(
            outcome.artifacts.map((artifact) => ({
              id: artifact.id,
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
        CASE WHEN ? THEN pg_notify('keel_runs', fence.id::text) END AS woken
      FROM fence`;
    // A run handed back (answered, resolved) wakes a worker.
    bindings.push(settlement.status === "queued");

    type FenceRow = FencedRun & { id: string; cancel_requested_by_actor_id: string | null; paused: boolean; policy: Policy };
    const apply = async (executor: Sql | SqlTransaction): Promise<FenceRow> => {
      const [run] = await rows<FenceRow>(executor, statement, bindings);
      if (run === undefined) throw new LeaseLostError(fence.runId, fence.epoch);
      return run;
    };
    const run =
      settlement.emissions.length === 0
        ? await apply(sql)
        : await sql.transaction(async (trx) => {
            const fenced = await apply(trx);
            await reserveEmissions(
              trx,
              { runId: fence.runId, agentId: fenced.agent_id, conversationId: fenced.conversation_id, externalConversationId: fenced.external_id, connector: fenced.connector },
              settlement.emissions,
            );
            return fenced;
          });
    return { cancelRequestedByActorId: run.cancel_requested_by_actor_id ?? undefined, paused: run.paused, policy: run.policy };
  };

  return {
    claimNext: (workerId, leaseMs) =>
      sql.transaction(async (trx): Promise<ClaimedRun | undefined> => {
        // A claim lost in a database crash is harmless: the worker's first durable commit flushes it.
        await trx.raw("SET LOCAL synchronous_commit = off");
        // Queued runs whose time has come, and runs whose worker stopped renewing its lease.
        const [claimed] = await rows<ClaimRow>(
          trx,
          `WITH candidate AS (
             SELECT id, status FROM runs
             WHERE NOT paused
               AND ((status = 'queued' AND not_before <= now())
                 OR (status IN ('running', 'awaiting_tool') AND lease_expires_at < now()))
             ORDER BY created_at
             LIMIT 1
             FOR UPDATE SKIP LOCKED
           )
           UPDATE runs r SET
             status = 'running', lease_owner = ?, lease_epoch = r.lease_epoch + 1,
             lease_expires_at = now() + make_interval(secs => ? / 1000.0),
             started_at = coalesce(r.started_at, now()), updated_at = now()
           FROM candidate c, agents a
           WHERE r.id = c.id AND a.id = r.agent_id
           RETURNING r.id, r.status, c.status AS previous_status, r.lease_epoch, r.step_count, r.usage, r.connector,
             r.started_at, r.cancel_requested_by_actor_id, r.requested_by_actor_id, r.reply_to_message_id, a.spec`,
          [workerId, leaseMs],
        );
        if (claimed === undefined) return undefined;
        const epoch = Number(claimed.lease_epoch);
        await appendRunEvents(trx, claimed.id, [
          {
            kind: "status_changed",
            status: "running",
            summary:
              claimed.previous_status === "queued"
                ? `claimed by ${workerId} at epoch ${epoch}`
                : `lease expired while ${claimed.previous_status}; reclaimed by ${workerId} at epoch ${epoch}`,
          },
        ]);
        const messages = await rows<{ external_message_id: string; actor_id: string; text: string }>(
          trx,
          `SELECT t.external_message_id, t.actor_id, m.text FROM run_triggers t JOIN messages m ON m.id = t.message_id
           WHERE t.run_id = ? ORDER BY t.received_at, m.created_at`,
          [claimed.id],
        );
        return {
          runId: claimed.id,
          epoch,
          agent: claimed.spec,
          connector: claimed.connector,
          status: claimed.previous_status,
          stepCount: Number(claimed.step_count),
          usage: { ...ZERO_USAGE, ...claimed.usage },
          startedAt: asDate(claimed.started_at),
          cancelRequestedByActorId: claimed.cancel_requested_by_actor_id ?? undefined,
          messages: messages.map((m): RunInputMessage => ({ messageId: m.external_message_id, actorId: m.actor_id, text: m.text })),
          requestedByActorId: claimed.requested_by_actor_id,
          replyToMessageId: claimed.reply_to_message_id ?? undefined,
        };
      }),

    async renewLease(runId, workerId, epoch, leaseMs) {
      const renewed = await rows<{ id: string }>(
        sql,
        `UPDATE runs SET lease_expires_at = now() + make_interval(secs => ? / 1000.0)
         WHERE id = ? AND lease_owner = ? AND lease_epoch = ? RETURNING id`,
        [leaseMs, runId, workerId, epoch],
      );
      return renewed.length === 1;
    },

    async loadHistory(runId): Promise<RunHistory> {
      const [steps, invocations, artifacts] = await Promise.all([
        rows<{ id: string; index: number; feedback: string | null; response_text: string | null; tool_calls: ToolCallRequest[] | null }>(
          sql,
          `SELECT s.id, s.index, s.feedback, m.response_text, m.tool_calls FROM run_steps s
           LEFT JOIN model_calls m ON m.step_id = s.id WHERE s.run_id = ? ORDER BY s.index`,
          [runId],
        ),
        rows<Record<string, unknown>>(sql, "SELECT * FROM tool_invocations WHERE run_id = ? ORDER BY created_at, ordinal", [runId]),
        rows<Record<string, unknown>>(sql, "SELECT * FROM artifacts WHERE run_id = ? ORDER BY created_at", [runId]),
      ]);
      return {
        steps: steps.map(
          (step): StepState => ({
            index: Number(step.index),
            responseText: step.response_text ?? "",
            toolCalls: step.tool_calls ?? [],
            feedback: step.feedback ?? undefined,
            invocations: invocations
              .filter((row) => row["step_id"] === step.id)
              .map(
                (row): InvocationState => ({
                  id: row["id"] as string,
                  providerCallId: row["provider_call_id"] as string,
                  toolName: row["tool_name"] as string,
                  effect: row["effect"] as InvocationState["effect"],
                  argumentsJson: JSON.stringify(row["arguments"]),
                  status: row["status"] as InvocationState["status"],
                  resultText: optional(row["result_text"] as string | null),
                  refusalReason: optional(row["refusal_reason"] as string | null),
                  resolvedOutcome: optional(row["resolved_outcome"] as InvocationState["resolvedOutcome"] | null),
                  resolvedByActorId: optional(row["resolved_by_actor_id"] as string | null),
                  resolutionReason: optional(row["resolution_reason"] as string | null),
                }),
              ),
          }),
        ),
        artifacts: artifacts.map(toArtifactRecord),
      };
    },

    commitStep: (commit) => {
      const step = commit.step;
      const events: RunEventDraft[] = [];
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
        outcome: undefined,
        crossesCommitBoundary: commit.crossesCommitBoundary ?? false,
        writes: step?.invocations.some((intent) => intent.effect === "write" && intent.status === "pending") ?? false,
        events,
      });
    },

    commitToolOutcome: (commit) =>
      commitFenced(commit, commit, {
        step: undefined,
        outcome: commit,
        crossesCommitBoundary: false,
        writes: commit.effect === "write",
        events: [{ kind: "tool_settled", toolInvocationId: commit.invocationId, summary: `${commit.outcome}: ${commit.resultText.slice(0, 120)}` }],
      }),

    async appendObservation(runId, invocationId, seq, stream, text) {
      await sql("observations").insert({ id: randomUUID(), run_id: runId, tool_invocation_id: invocationId, seq, stream, text });
    },

    release: (fence, summary) =>
      sql.transaction(async (trx) => {
        const released = await rows<{ id: string }>(
          trx,
          `UPDATE runs SET status = 'queued', wait_reason = CASE WHEN paused THEN 'paused' ELSE wait_reason END,
             lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
           WHERE id = ? AND lease_epoch = ? AND lease_owner = ? RETURNING id`,
          [fence.runId, fence.epoch, fence.workerId],
        );
        if (released.length === 0) throw new LeaseLostError(fence.runId, fence.epoch);
        await appendRunEvents(trx, fence.runId, [{ kind: "status_changed", status: "queued", summary }]);
      }),
  };
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
