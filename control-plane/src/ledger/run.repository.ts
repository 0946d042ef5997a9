import type { AgentSpec } from "../domain/agent.js";
import { LeaseLostError } from "../domain/errors.js";
import { isTerminal, ZERO_USAGE, type RunStatus, type RunUsage } from "../domain/run.js";
import type { ClaimedRun, RunInputMessage, RunStore, StepCommit } from "../runner/run-store.js";
import { appendRunEvents, reserveEmissions, type RunEventDraft } from "./ledger-writes.js";
import { asDate, rows, type Sql } from "./sql.js";

interface ClaimRow {
  id: string;
  status: RunStatus;
  previous_status: RunStatus;
  lease_epoch: string;
  step_count: number;
  usage: Partial<RunUsage>;
  started_at: Date;
  cancel_requested_by_actor_id: string | null;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  spec: AgentSpec;
}

export function createRunRepository(sql: Sql): RunStore {
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
             status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
             lease_owner = ?, lease_epoch = r.lease_epoch + 1,
             lease_expires_at = now() + make_interval(secs => ? / 1000.0),
             started_at = coalesce(r.started_at, now()), updated_at = now()
           FROM candidate c, agents a
           WHERE r.id = c.id AND a.id = r.agent_id
           RETURNING r.id, r.status, c.status AS previous_status, r.lease_epoch, r.step_count, r.usage,
             r.started_at, r.cancel_requested_by_actor_id, r.requested_by_actor_id, r.reply_to_message_id, a.spec`,
          [workerId, leaseMs],
        );
        if (claimed === undefined) return undefined;
        const epoch = Number(claimed.lease_epoch);
        const events: RunEventDraft[] = [];
        if (claimed.previous_status === "queued") {
          events.push({ kind: "status_changed", status: "running", summary: `claimed by ${workerId} at epoch ${epoch}` });
        } else {
          events.push({ kind: "status_changed", status: claimed.status, summary: `lease expired; reclaimed by ${workerId} at epoch ${epoch}` });
        }
        await appendRunEvents(trx, claimed.id, events);
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
          status: claimed.status,
          stepCount: Number(claimed.step_count),
          usage: { ...ZERO_USAGE, ...claimed.usage },
          startedAt: asDate(claimed.started_at),
          cancelRequestedByActorId: claimed.cancel_requested_by_actor_id ?? undefined,
          messages: messages.map(
            (m): RunInputMessage => ({ messageId: m.external_message_id, actorId: m.actor_id, text: m.text }),
          ),
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

    commitStep: (commit: StepCommit) =>
      sql.transaction(async (trx) => {
        // The fence: lock the run row and refuse if another worker has claimed since.
        const [run] = await rows<{
          lease_epoch: string;
          lease_owner: string | null;
          status: RunStatus;
          agent_id: string;
          conversation_id: string;
          connector: string;
          external_id: string;
        }>(
          trx,
          `SELECT r.lease_epoch, r.lease_owner, r.status, r.agent_id, r.conversation_id, r.connector, c.external_id
           FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ? FOR UPDATE OF r`,
          [commit.runId],
        );
        if (run === undefined || Number(run.lease_epoch) !== commit.epoch || run.lease_owner !== commit.workerId) {
          throw new LeaseLostError(commit.runId, commit.epoch);
        }
        const events: RunEventDraft[] = [];
        if (commit.step !== undefined) {
          const step = commit.step;
          await trx("run_steps").insert({
            id: step.id,
            run_id: commit.runId,
            index: step.index,
            replayability: step.replayability,
            run_status_after: commit.status,
            actor_id: step.actorId ?? null,
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
          events.push({ kind: "step_committed", stepId: step.id, status: commit.status, summary: `step ${step.index}: ${commit.summary}` });
        }
        const terminal = isTerminal(commit.status);
        await trx.raw(
          `UPDATE runs SET status = ?, usage = ?::jsonb, step_count = step_count + ?, final_reply = coalesce(?, final_reply),
             error = coalesce(?, error), exhausted_dimension = coalesce(?, exhausted_dimension), updated_at = now(),
             finished_at = CASE WHEN ? THEN now() ELSE finished_at END,
             lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END,
             lease_expires_at = CASE WHEN ? THEN NULL ELSE lease_expires_at END
           WHERE id = ?`,
          [
            commit.status,
            JSON.stringify(commit.usage),
            commit.step === undefined ? 0 : 1,
            commit.finalReply ?? null,
            commit.error ?? null,
            commit.exhaustedDimension ?? null,
            terminal,
            terminal,
            terminal,
            commit.runId,
          ],
        );
        if (commit.status !== run.status) {
          events.push({ kind: "status_changed", status: commit.status, summary: commit.summary });
        }
        await appendRunEvents(trx, commit.runId, events);
        await reserveEmissions(
          trx,
          {
            runId: commit.runId,
            agentId: run.agent_id,
            conversationId: run.conversation_id,
            externalConversationId: run.external_id,
            connector: run.connector,
          },
          commit.emissions,
        );
      }),
  };
}
