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
  RunStore,
  Settlement,
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

/** Statuses in which a worker keeps its lease. */
const HELD: ReadonlySet<RunStatus> = new Set(["running", "awaiting_tool"]);

export function createRunRepository(sql: Sql): RunStore {
  /** Locks the run row and refuses if another worker has claimed it since `fence.epoch`. */
  const fenced = async <T>(fence: Fence, work: (trx: SqlTransaction, run: FencedRun) => Promise<T>): Promise<T> =>
    sql.transaction(async (trx) => {
      const [run] = await rows<FencedRun & { lease_epoch: string; lease_owner: string | null }>(
        trx,
        `SELECT r.lease_epoch, r.lease_owner, r.status, r.agent_id, r.conversation_id, r.connector, c.external_id
         FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ? FOR UPDATE OF r`,
        [fence.runId],
      );
      if (run === undefined || Number(run.lease_epoch) !== fence.epoch || run.lease_owner !== fence.workerId) {
        throw new LeaseLostError(fence.runId, fence.epoch);
      }
      return work(trx, run);
    });

  /** Writes the run's new status, usage, events and emissions: the tail of every fenced commit. */
  const settle = async (
    trx: SqlTransaction,
    fence: Fence,
    run: FencedRun,
    settlement: Settlement,
    events: RunEventDraft[],
    extra: { stepAdded: boolean; crossesCommitBoundary: boolean },
  ): Promise<void> => {
    const terminal = isTerminal(settlement.status);
    const keepsLease = HELD.has(settlement.status);
    await trx.raw(
      `UPDATE runs SET status = ?, usage = ?::jsonb, step_count = step_count + ?,
         final_reply = coalesce(?, final_reply), error = coalesce(?, error),
         exhausted_dimension = coalesce(?, exhausted_dimension), wait_reason = ?,
         commit_boundary = CASE WHEN ? THEN 'committed' ELSE commit_boundary END,
         updated_at = now(), finished_at = CASE WHEN ? THEN now() ELSE finished_at END,
         lease_owner = CASE WHEN ? THEN lease_owner ELSE NULL END,
         lease_expires_at = CASE WHEN ? THEN lease_expires_at ELSE NULL END
       WHERE id = ?`,
      [
        settlement.status,
        JSON.stringify(settlement.usage),
        extra.stepAdded ? 1 : 0,
        settlement.finalReply ?? null,
        settlement.error ?? null,
        settlement.exhaustedDimension ?? null,
        settlement.waitReason ?? null,
        extra.crossesCommitBoundary,
        terminal,
        keepsLease,
        keepsLease,
        fence.runId,
      ],
    );
    if (settlement.status !== run.status) events.push({ kind: "status_changed", status: settlement.status, summary: settlement.summary });
    await appendRunEvents(trx, fence.runId, events);
    await reserveEmissions(
      trx,
      {
        runId: fence.runId,
        agentId: run.agent_id,
        conversationId: run.conversation_id,
        externalConversationId: run.external_id,
        connector: run.connector,
      },
      settlement.emissions,
    );
    // A run handed back (resolved, answered, requeued) wakes a worker.
    if (settlement.status === "queued") await trx.raw("SELECT pg_notify('keel_runs', ?)", [fence.runId]);
  };

  return {
    claimNext: (workerId, leaseMs) =>
      sql.transaction(async (trx): Promise<ClaimedRun | undefined> => {
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

    async readControl(runId, agentId) {
      const [row] = await rows<{ cancel_requested_by_actor_id: string | null; paused: boolean; spec: AgentSpec }>(
        sql,
        "SELECT r.cancel_requested_by_actor_id, r.paused, a.spec FROM runs r JOIN agents a ON a.id = ? WHERE r.id = ?",
        [agentId, runId],
      );
      if (row === undefined) throw new Error(`run ${runId} vanished`);
      return {
        cancelRequestedByActorId: row.cancel_requested_by_actor_id ?? undefined,
        paused: row.paused,
        policy: row.spec.policy as Policy,
      };
    },

    commitStep: (commit) =>
      fenced(commit, async (trx, run) => {
        const events: RunEventDraft[] = [];
        const step = commit.step;
        if (step !== undefined) {
          await trx("run_steps").insert({
            id: step.id,
            run_id: commit.runId,
            index: step.index,
            replayability: step.replayability,
            run_status_after: commit.status,
            actor_id: step.actorId ?? null,
            feedback: step.feedback ?? null,
            lease_epoch: commit.epoch,
            started_at: step.startedAt,
          });
          if (step.modelCall !== undefined) {
            const call = step.modelCall;
            await trx("model_calls").insert({
              id: call.id,
              run_id: commit.runId,
              step_id: step.id,
              role: call.role,
              provider: call.provider,
              model: call.model,
              request: JSON.stringify(call.request),
              response_text: call.responseText,
              tool_calls: JSON.stringify(call.toolCalls),
              input_tokens: call.inputTokens,
              output_tokens: call.outputTokens,
              latency_ms: call.latencyMs,
              finish_reason: call.finishReason,
              cost_micro_usd: call.costMicroUsd,
            });
          }
          if (step.invocations.length > 0) {
            await trx("tool_invocations").insert(
              step.invocations.map((intent) => ({
                id: intent.id,
                run_id: commit.runId,
                step_id: step.id,
                model_call_id: step.modelCall?.id ?? null,
                provider_call_id: intent.providerCallId,
                ordinal: intent.ordinal,
                tool_name: intent.toolName,
                tool_version: intent.toolVersion,
                effect: intent.effect,
                arguments: intent.argumentsJson,
                status: intent.status,
                refusal_reason: intent.refusalReason ?? null,
                finished_at: intent.status === "refused" ? new Date() : null,
              })),
            );
            for (const intent of step.invocations) {
              events.push({
                kind: intent.status === "refused" ? "tool_settled" : "tool_invoked",
                toolInvocationId: intent.id,
                stepId: step.id,
                summary: intent.status === "refused" ? `${intent.toolName} refused: ${intent.refusalReason ?? ""}` : `${intent.toolName} intent recorded`,
              });
            }
          }
          events.push({ kind: "step_committed", stepId: step.id, status: commit.status, summary: `step ${step.index}: ${commit.summary}` });
        }
        await settle(trx, commit, run, commit, events, {
          stepAdded: step !== undefined,
          crossesCommitBoundary: commit.crossesCommitBoundary ?? false,
        });
      }),

    commitToolOutcome: (commit) =>
      fenced(commit, async (trx, run) => {
        await trx.raw(
          `UPDATE tool_invocations SET status = ?, result_text = ?, refusal_reason = coalesce(?, refusal_reason),
             exit_code = ?, duration_ms = ?, output_truncated = ?, finished_at = now(),
             resolved_by_actor_id = coalesce(?, resolved_by_actor_id), resolved_outcome = coalesce(?, resolved_outcome)
           WHERE id = ? AND run_id = ?`,
          [
            commit.outcome,
            commit.resultText,
            commit.refusalReason ?? null,
            commit.exitCode ?? null,
            commit.durationMs ?? null,
            commit.truncated ?? false,
            commit.answeredByActorId ?? null,
            commit.resolvedOutcome ?? null,
            commit.invocationId,
            commit.runId,
          ],
        );
        if (commit.resultText !== "" && commit.outcome !== "refused") {
          // The whole result is an observation too, so compaction can point at it.
          await trx.raw(
            `INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text, truncated)
             SELECT ?, ?, ?, coalesce(max(seq), 0) + 1, 'result', ?, ? FROM observations WHERE tool_invocation_id = ?`,
            [randomUUID(), commit.runId, commit.invocationId, commit.resultText, commit.truncated ?? false, commit.invocationId],
          );
        }
        if (commit.artifacts.length > 0) {
          await trx("artifacts").insert(
            commit.artifacts.map((artifact) => ({
              id: randomUUID(),
              run_id: commit.runId,
              tool_invocation_id: commit.invocationId,
              type: artifact.type,
              schema_version: artifact.schemaVersion,
              provenance: artifact.provenance,
              inline_data: artifact.inlineData ?? null,
              reference: artifact.reference ?? null,
              subject_artifact_id: artifact.subjectArtifactId ?? null,
              conclusion: artifact.conclusion ?? null,
            })),
          );
        }
        await settle(
          trx,
          commit,
          run,
          commit,
          [{ kind: "tool_settled", toolInvocationId: commit.invocationId, summary: `${commit.outcome}: ${commit.resultText.slice(0, 120)}` }],
          { stepAdded: false, crossesCommitBoundary: false },
        );
      }),

    async appendObservation(runId, invocationId, seq, stream, text) {
      await sql("observations").insert({ id: randomUUID(), run_id: runId, tool_invocation_id: invocationId, seq, stream, text });
    },

    release: (fence, summary) =>
      fenced(fence, async (trx) => {
        await trx.raw(
          "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = now() WHERE id = ?",
          [fence.runId],
        );
        await appendRunEvents(trx, fence.runId, [{ kind: "status_changed", status: "queued", summary }]);
      }),
  };
}
