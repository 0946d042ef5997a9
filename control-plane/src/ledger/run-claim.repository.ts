// Claiming a run: the candidate query, admission checked again under the admission lock, and the
// lease start with the run's input, all in one transaction.
import { systemClock, type Clock } from "../domain/clock.js";
import { ZERO_USAGE, type CommitBoundary, type RunStatus, type RunUsage } from "../domain/run.js";
import type { AgentSpec } from "../domain/agent.js";
import type { ClaimedRun, RunStore } from "../runner/run-store.js";
import { ADMISSION_LOCK, AGENT_CEILING_SQL } from "./ledger-writes.js";
import { toInputMessages, TRIGGERS_SQL, type TriggerRow } from "./run-triggers.js";
import { asDate, optionalDate, preparedRows, type Sql } from "./sql.js";

/** Used when the composition root passes no install ceiling (tests, benchmarks). */
const DEFAULT_INSTALL_CEILING = 64;

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
  superseded_by_run_id: string | null;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  commit_boundary: CommitBoundary;
  logical_request_id: string;
  trigger_count: number;
  messages: TriggerRow[] | null;
  inherits_from_run_id: string | null;
  spec: AgentSpec;
}

/** Non-terminal statuses: a started root run in one of these is its conversation's run in flight. */
const LIVE_SQL = "'queued', 'running', 'awaiting_tool', 'awaiting_input', 'waiting'";
/**
 * A conversation's queue order: by when its logical request arrived, so a successor keeps the
 * place of the request it supersedes, ahead of independent requests that came after it.
 */
export const MAILBOX_ORDER_SQL = "coalesce(request_received_at, created_at), created_at, id";

export interface RunClaimOptions {
  /** Coalesce windows and admission are decided on this clock, not the database's. */
  readonly clock?: Clock;
  /** The install's ceiling on concurrent root runs, across agents. */
  readonly maxConcurrentRootRuns?: number;
}

export function createRunClaimRepository(sql: Sql, options: RunClaimOptions = {}): Pick<RunStore, "claimNext" | "nextDueAt"> {
  const clock = options.clock ?? systemClock;
  const installCeiling = options.maxConcurrentRootRuns ?? DEFAULT_INSTALL_CEILING;
  return {
    claimNext: (workerId, leaseMs) =>
      sql.transaction(async (trx): Promise<ClaimedRun | undefined> => {
        const now = clock.now();
        // 1. A candidate: a queued run whose time has come and that admission would let start
        //    (the head of its conversation's queue, the conversation idle, both ceilings clear),
        //    or a run whose worker stopped renewing its lease. Then, for a queued one, the
        //    admission lock: every start of a queued run is serialized by it, so the checks in
        //    the next statement (a fresh snapshot, taken after the lock) see every start
        //    committed before them. Holding the row (SKIP LOCKED) keeps other workers off it.
        //    A claim lost in a database crash is harmless: the first durable commit flushes it.
        const [candidate] = await preparedRows<{ id: string; status: RunStatus; fresh: boolean }>(
          trx,
          `WITH durability AS (SELECT set_config('synchronous_commit', 'off', true) AS setting),
           executing AS (
             SELECT agent_id, count(*)::int AS n FROM runs
             WHERE status IN ('running', 'awaiting_tool') AND parent_run_id IS NULL GROUP BY agent_id),
           busy AS (
             SELECT DISTINCT conversation_id FROM runs
             WHERE parent_run_id IS NULL AND started_at IS NOT NULL AND status IN (${LIVE_SQL})),
           heads AS (
             SELECT DISTINCT ON (conversation_id) id FROM runs
             WHERE status = 'queued' AND started_at IS NULL AND parent_run_id IS NULL
             ORDER BY conversation_id, ${MAILBOX_ORDER_SQL}),
           candidate AS (
             SELECT r.id, r.status, r.started_at IS NULL AS fresh FROM runs r
             JOIN agents a ON a.id = r.agent_id
             LEFT JOIN executing e ON e.agent_id = r.agent_id
             WHERE NOT r.paused AND (
               (r.status = 'queued' AND r.not_before <= ?
                 AND (r.parent_run_id IS NOT NULL OR (
                   coalesce(e.n, 0) < ${AGENT_CEILING_SQL}
                   AND (SELECT coalesce(sum(n), 0) FROM executing) < ?
                   AND (r.started_at IS NOT NULL OR (r.id IN (SELECT id FROM heads) AND r.conversation_id NOT IN (SELECT conversation_id FROM busy))))))
               OR (r.status IN ('running', 'awaiting_tool') AND r.lease_expires_at < now()))
             ORDER BY r.created_at
             LIMIT 1
             FOR UPDATE OF r SKIP LOCKED)
           SELECT c.id, c.status, c.fresh, d.setting,
             CASE WHEN c.status = 'queued' THEN pg_advisory_xact_lock(${ADMISSION_LOCK}) END AS admitted
           FROM candidate c, durability d`,
          [now, installCeiling],
        );
        if (candidate === undefined) return undefined;
        const queued = candidate.status === "queued";
        // 2. Admission, checked again under the lock, and the claim, its event and the run's input, in one statement.
        const [claimed] = await preparedRows<ClaimRow>(
          trx,
          `WITH executing AS (
             SELECT agent_id FROM runs WHERE status IN ('running', 'awaiting_tool') AND parent_run_id IS NULL),
           claimed AS (
             UPDATE runs r SET
               status = 'running', lease_owner = ?, lease_epoch = r.lease_epoch + 1,
               lease_expires_at = now() + make_interval(secs => ? / 1000.0),
               started_at = coalesce(r.started_at, ?), updated_at = now(), event_seq = r.event_seq + 1
             FROM agents a
             WHERE r.id = ? AND a.id = r.agent_id AND NOT r.paused
               AND CASE WHEN ? THEN
                 r.status = 'queued' AND r.not_before <= ?
                 AND (r.parent_run_id IS NOT NULL OR (
                   (SELECT count(*) FROM executing x WHERE x.agent_id = r.agent_id) < ${AGENT_CEILING_SQL}
                   AND (SELECT count(*) FROM executing) < ?
                   AND (r.started_at IS NOT NULL OR NOT EXISTS (
                     SELECT 1 FROM runs o WHERE o.conversation_id = r.conversation_id AND o.parent_run_id IS NULL AND o.id <> r.id
                       AND o.started_at IS NOT NULL AND o.status IN (${LIVE_SQL})))))
               ELSE r.status IN ('running', 'awaiting_tool') AND r.lease_expires_at < now() END
             RETURNING r.id, r.status, r.lease_epoch, r.step_count, r.usage, r.connector, r.started_at, r.event_seq,
               r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.requested_by_actor_id, r.reply_to_message_id, r.commit_boundary,
               coalesce(r.logical_request_id, r.id) AS logical_request_id, r.trigger_count, r.inherits_from_run_id, a.spec),
           event AS (
             INSERT INTO run_events (run_id, seq, kind, status, summary)
             SELECT id, event_seq, 'status_changed', 'running', ? || ' at epoch ' || lease_epoch FROM claimed)
           SELECT claimed.*, ?::text AS previous_status,
             (${TRIGGERS_SQL.replace("?", "claimed.id")}) AS messages,
             pg_notify('keel_run_events', claimed.id::text) AS notified
           FROM claimed`,
          [
            workerId,
            leaseMs,
            now,
            candidate.id,
            queued,
            now,
            installCeiling,
            queued ? `claimed by ${workerId}` : `lease expired while ${candidate.status}; reclaimed by ${workerId}`,
            candidate.status,
          ],
        );
        // Another start got in first (the conversation, or a ceiling): leave it; a settle wakes a worker.
        if (claimed === undefined) return undefined;
        return {
          runId: claimed.id,
          epoch: Number(claimed.lease_epoch),
          agent: claimed.spec,
          connector: claimed.connector,
          status: claimed.previous_status,
          stepCount: Number(claimed.step_count),
          usage: { ...ZERO_USAGE, ...claimed.usage },
          startedAt: asDate(claimed.started_at),
          cancelRequestedByActorId: claimed.cancel_requested_by_actor_id ?? undefined,
          supersededByRunId: claimed.superseded_by_run_id ?? undefined,
          messages: toInputMessages(claimed.messages),
          triggerCount: Number(claimed.trigger_count),
          requestedByActorId: claimed.requested_by_actor_id,
          replyToMessageId: claimed.reply_to_message_id ?? undefined,
          logicalRequestId: claimed.logical_request_id,
          commitBoundary: claimed.commit_boundary,
          inheritsFromRunId: claimed.inherits_from_run_id ?? undefined,
        };
      }),

    async nextDueAt() {
      const [row] = await preparedRows<{ due: unknown }>(
        sql,
        "SELECT min(not_before) AS due FROM runs WHERE status = 'queued' AND NOT paused AND not_before > ?",
        [clock.now()],
      );
      return optionalDate(row?.due);
    },
  };
}
