import { FailedPreconditionError, NotFoundError } from "../domain/errors.js";
import { isTerminal, type CommitBoundary, type RunStatus } from "../domain/run.js";
import type { RunControl } from "../runner/run-control.js";
import { appendRunEvents, stopParkedRun } from "./ledger-writes.js";
import { rows, type Sql, type SqlTransaction } from "./sql.js";

interface LockedRun {
  status: RunStatus;
  agent_id: string;
  conversation_id: string;
  connector: string;
  external_id: string;
  reply_to_message_id: string | null;
  requested_by_actor_id: string;
  paused: boolean;
  logical_request_id: string;
  commit_boundary: CommitBoundary;
  addressed: string[] | null;
}

/** Statuses with no worker holding the run: a change applies at once. */
const PARKED: ReadonlySet<RunStatus> = new Set(["queued", "awaiting_input", "waiting"]);

export function createRunControlRepository(sql: Sql): RunControl {
  const locked = <T>(runId: string, work: (trx: SqlTransaction, run: LockedRun) => Promise<T>): Promise<T> =>
    sql.transaction(async (trx) => {
      const [run] = await rows<LockedRun>(
        trx,
        `SELECT r.status, r.agent_id, r.conversation_id, r.connector, c.external_id, r.reply_to_message_id,
           r.requested_by_actor_id, r.paused, coalesce(r.logical_request_id, r.id) AS logical_request_id, r.commit_boundary,
           (SELECT json_agg(DISTINCT t.actor_id) FROM run_triggers t WHERE t.run_id = r.id AND t.relation <> 'cancels') AS addressed
         FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ? FOR NO KEY UPDATE OF r`,
        [runId],
      );
      if (run === undefined) throw new NotFoundError("run", runId);
      return work(trx, run);
    });

  const requeue = async (trx: SqlTransaction, runId: string, summary: string): Promise<RunStatus> => {
    await trx.query(
      `UPDATE runs SET status = 'queued', wait_reason = CASE WHEN paused THEN 'paused' ELSE NULL END,
         lease_owner = NULL, lease_expires_at = NULL, updated_at = now() WHERE id = ?`,
      [runId],
    );
    await appendRunEvents(trx, runId, [{ kind: "status_changed", status: "queued", summary }]);
    await trx.query("SELECT pg_notify('keel_runs', ?)", [runId]);
    return "queued";
  };

  const mustBeLive = (run: LockedRun, runId: string) => {
    if (isTerminal(run.status)) throw new FailedPreconditionError(`run ${runId} already ended as ${run.status}`);
  };

  return {
    cancel: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        await trx.query("UPDATE runs SET cancel_requested_by_actor_id = ?, cancel_reason = ?, updated_at = now() WHERE id = ?", [actorId, reason, runId]);
        if (!PARKED.has(run.status)) {
          await appendRunEvents(trx, runId, [{ kind: "status_changed", status: run.status, summary: `cancellation requested by ${actorId}: ${reason}` }]);
          return run.status;
        }
        await stopParkedRun(trx, {
          runId,
          agentId: run.agent_id,
          conversationId: run.conversation_id,
          externalConversationId: run.external_id,
          connector: run.connector,
          replyToMessageId: run.reply_to_message_id,
          logicalRequestId: run.logical_request_id,
          commitBoundary: run.commit_boundary,
          addressedActorIds: run.addressed ?? [run.requested_by_actor_id],
          actorId,
          reason,
        });
        return "cancelled";
      }),

    answer: (runId, actorId, text) =>
      locked(runId, async (trx, run) => {
        if (run.status !== "awaiting_input") throw new FailedPreconditionError(`run ${runId} is ${run.status}, not awaiting input`);
        const answered = await rows<{ id: string }>(
          trx,
          `UPDATE tool_invocations SET status = 'succeeded', result_text = ?, resolved_by_actor_id = ?, finished_at = now()
           WHERE run_id = ? AND status = 'pending' AND tool_name = 'keel.ask_user.v1' RETURNING id`,
          [`Answer from ${actorId}: ${text}`, actorId, runId],
        );
        if (answered.length === 0) throw new FailedPreconditionError(`run ${runId} has no open question`);
        await trx.query("INSERT INTO actors (id) VALUES (?) ON CONFLICT (id) DO NOTHING", [actorId]);
        await appendRunEvents(trx, runId, [{ kind: "tool_settled", toolInvocationId: answered[0]!.id, summary: `answered by ${actorId}` }]);
        return requeue(trx, runId, `answered by ${actorId}`);
      }),

    resolveUnknownOutcome: (runId, invocationId, outcome, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        const resolved = await rows<{ id: string }>(
          trx,
          `UPDATE tool_invocations SET resolved_outcome = ?, resolved_by_actor_id = ?, resolution_reason = ?
           WHERE id = ? AND run_id = ? AND status = 'unknown_outcome' AND resolved_outcome IS NULL RETURNING id`,
          [outcome, actorId, reason, invocationId, runId],
        );
        if (resolved.length === 0) {
          throw new FailedPreconditionError(`tool invocation ${invocationId} of run ${runId} has no unresolved unknown outcome`);
        }
        await appendRunEvents(trx, runId, [{ kind: "tool_settled", toolInvocationId: invocationId, summary: `resolved as ${outcome} by ${actorId}: ${reason}` }]);
        const [open] = await rows<{ n: string }>(
          trx,
          "SELECT count(*) AS n FROM tool_invocations WHERE run_id = ? AND status = 'unknown_outcome' AND resolved_outcome IS NULL",
          [runId],
        );
        if (Number(open?.n ?? 0) > 0 || run.status !== "waiting") return run.status;
        return requeue(trx, runId, `unknown outcomes resolved by ${actorId}`);
      }),

    pause: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        await trx.query(
          "UPDATE runs SET paused = true, wait_reason = CASE WHEN status = 'queued' THEN 'paused' ELSE wait_reason END, updated_at = now() WHERE id = ?",
          [runId],
        );
        await appendRunEvents(trx, runId, [{ kind: "status_changed", status: run.status, summary: `paused by ${actorId}: ${reason}` }]);
        return run.status;
      }),

    resume: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        if (!run.paused) throw new FailedPreconditionError(`run ${runId} is not paused`);
        await trx.query(
          "UPDATE runs SET paused = false, wait_reason = CASE WHEN wait_reason = 'paused' THEN NULL ELSE wait_reason END, updated_at = now() WHERE id = ?",
          [runId],
        );
        await appendRunEvents(trx, runId, [{ kind: "status_changed", status: run.status, summary: `resumed by ${actorId}: ${reason}` }]);
        await trx.query("SELECT pg_notify('keel_runs', ?)", [runId]);
        return run.status;
      }),

    requeue: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        if (run.status === "awaiting_input" || run.status === "waiting") {
          throw new FailedPreconditionError(`run ${runId} is ${run.status}: answer it or resolve its unknown outcome instead`);
        }
        return requeue(trx, runId, `requeued by ${actorId}: ${reason}`);
      }),
  };
}
