import { FailedPreconditionError, NotFoundError } from "../domain/errors.js";
import { isTerminal, PARKED_STATUSES, type CommitBoundary, type RunStatus } from "../domain/run.js";
import type { RunControl } from "../runner/run-control.js";
import { appendRunEvents, stopParkedRun } from "./ledger-writes.js";
import { ROOT_COMMIT_BOUNDARY_SQL } from "./conversation-run.rows.js";
import { raw, statement, type Sql, type SqlTransaction } from "./sql.js";

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
const PARKED: ReadonlySet<RunStatus> = new Set(PARKED_STATUSES);

const runId = (p: { readonly runId: string }) => p.runId;
const actorId = (p: { readonly actorId: string }) => p.actorId;

/** The run and what stopping it needs, row-locked until the commit (NO KEY: foreign-key checks on it go on). */
const lockRun = statement<{ runId: string }, LockedRun>("run_control_lock_run")`
  SELECT r.status, r.agent_id, r.conversation_id, r.connector, c.external_id, r.reply_to_message_id,
    r.requested_by_actor_id, r.paused, coalesce(r.logical_request_id, r.id) AS logical_request_id, ${raw(ROOT_COMMIT_BOUNDARY_SQL)} AS commit_boundary,
    (SELECT json_agg(DISTINCT t.actor_id) FROM run_triggers t WHERE t.run_id = r.id AND t.relation <> 'cancels') AS addressed
  FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ${runId}::uuid FOR NO KEY UPDATE OF r`;

const requeueRun = statement<{ runId: string }>("run_control_requeue")`
  UPDATE runs SET status = 'queued', wait_reason = CASE WHEN paused THEN 'paused' ELSE NULL END,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now() WHERE id = ${runId}::uuid`;

const requestCancel = statement<{ runId: string; actorId: string; reason: string }>("run_control_request_cancel")`
  UPDATE runs SET cancel_requested_by_actor_id = ${actorId}, cancel_reason = ${(p) => p.reason}, updated_at = now()
  WHERE id = ${runId}::uuid`;

const answerQuestion = statement<{ runId: string; actorId: string; resultText: string }, { id: string }>("run_control_answer")`
  UPDATE tool_invocations SET status = 'succeeded', result_text = ${(p) => p.resultText}, resolved_by_actor_id = ${actorId},
    finished_at = now()
  WHERE run_id = ${runId}::uuid AND status = 'pending' AND tool_name = 'keel.ask_user.v1' RETURNING id`;

const ensureActor = statement<{ actorId: string }>("run_control_ensure_actor")`
  INSERT INTO actors (id) VALUES (${actorId}) ON CONFLICT (id) DO NOTHING`;

const resolveOutcome = statement<
  { runId: string; invocationId: string; outcome: string; actorId: string; reason: string },
  { id: string }
>("run_control_resolve_outcome")`
  UPDATE tool_invocations SET resolved_outcome = ${(p) => p.outcome}, resolved_by_actor_id = ${actorId},
    resolution_reason = ${(p) => p.reason}
  WHERE id = ${(p) => p.invocationId}::uuid AND run_id = ${runId}::uuid AND status = 'unknown_outcome' AND resolved_outcome IS NULL
  RETURNING id`;

const openUnknownOutcomes = statement<{ runId: string }, { n: number }>("run_control_open_unknown_outcomes")`
  SELECT count(*)::int AS n FROM tool_invocations
  WHERE run_id = ${runId}::uuid AND status = 'unknown_outcome' AND resolved_outcome IS NULL`;

const pauseRun = statement<{ runId: string }>("run_control_pause")`
  UPDATE runs SET paused = true, wait_reason = CASE WHEN status = 'queued' THEN 'paused' ELSE wait_reason END, updated_at = now()
  WHERE id = ${runId}::uuid`;

const resumeRun = statement<{ runId: string }>("run_control_resume")`
  UPDATE runs SET paused = false, wait_reason = CASE WHEN wait_reason = 'paused' THEN NULL ELSE wait_reason END, updated_at = now()
  WHERE id = ${runId}::uuid`;

export function createRunControlRepository(sql: Sql): RunControl {
  const locked = <T>(runId: string, work: (trx: SqlTransaction, run: LockedRun) => Promise<T>): Promise<T> =>
    sql.transaction(async (trx) => {
      const [run] = await trx.run(lockRun, { runId });
      if (run === undefined) throw new NotFoundError("run", runId);
      return work(trx, run);
    });

  const requeue = async (trx: SqlTransaction, runId: string, summary: string): Promise<RunStatus> => {
    await trx.run(requeueRun, { runId });
    await appendRunEvents(trx, runId, [{ kind: "status_changed", status: "queued", summary }]);
    trx.notify("keel_runs", runId);
    return "queued";
  };

  const mustBeLive = (run: LockedRun, runId: string) => {
    if (isTerminal(run.status)) throw new FailedPreconditionError(`run ${runId} already ended as ${run.status}`);
  };

  return {
    cancel: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        await trx.run(requestCancel, { runId, actorId, reason });
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
        const answered = await trx.run(answerQuestion, { runId, actorId, resultText: `Answer from ${actorId}: ${text}` });
        if (answered.length === 0) throw new FailedPreconditionError(`run ${runId} has no open question`);
        await trx.run(ensureActor, { actorId });
        await appendRunEvents(trx, runId, [{ kind: "tool_settled", toolInvocationId: answered[0]!.id, summary: `answered by ${actorId}` }]);
        return requeue(trx, runId, `answered by ${actorId}`);
      }),

    resolveUnknownOutcome: (runId, invocationId, outcome, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        const resolved = await trx.run(resolveOutcome, { runId, invocationId, outcome, actorId, reason });
        if (resolved.length === 0) {
          throw new FailedPreconditionError(`tool invocation ${invocationId} of run ${runId} has no unresolved unknown outcome`);
        }
        await appendRunEvents(trx, runId, [{ kind: "tool_settled", toolInvocationId: invocationId, summary: `resolved as ${outcome} by ${actorId}: ${reason}` }]);
        const [open] = await trx.run(openUnknownOutcomes, { runId });
        if ((open?.n ?? 0) > 0 || run.status !== "waiting") return run.status;
        return requeue(trx, runId, `unknown outcomes resolved by ${actorId}`);
      }),

    pause: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        await trx.run(pauseRun, { runId });
        await appendRunEvents(trx, runId, [{ kind: "status_changed", status: run.status, summary: `paused by ${actorId}: ${reason}` }]);
        return run.status;
      }),

    resume: (runId, actorId, reason) =>
      locked(runId, async (trx, run) => {
        mustBeLive(run, runId);
        if (!run.paused) throw new FailedPreconditionError(`run ${runId} is not paused`);
        await trx.run(resumeRun, { runId });
        await appendRunEvents(trx, runId, [{ kind: "status_changed", status: run.status, summary: `resumed by ${actorId}: ${reason}` }]);
        trx.notify("keel_runs", runId);
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
