// Claiming a run: a candidate the run-start rule lets start (or whose lease expired), the rule
// checked again under the start locks, and the lease start with the run's input, in one
// transaction.
import type { AgentSpec } from "../domain/agent.js";
import { systemClock, type Clock } from "../domain/clock.js";
import { ZERO_USAGE, type CommitBoundary, type RunStatus, type RunUsage } from "../domain/run.js";
import type { ClaimedRun, RunStore } from "../runner/run-store.js";
import { CLAIMABLE_SQL, claimStartLocksSql, EXECUTING_SQL, FACTS_LOCKED, FACTS_SET, FACTS_SET_CTES, mayStartSql } from "./run-start.sql.js";
import { toInputMessages, triggersSql, type TriggerRow } from "./run-triggers.js";
import { asDate, optionalDate, raw, statement, type Sql, type SqlTransaction } from "./sql.js";
import { replayableCommit, type Durability } from "./step-commit-params.js";
import { durabilityCte } from "./server-durability.js";

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
  conversation_id: string;
  spec: AgentSpec;
  parent_run_id: string | null;
}

interface CandidateParams {
  readonly now: Date;
}
const now = (p: { now: Date }) => p.now;

/** A run whose worker stopped renewing its lease: claimable again, whatever the ceilings say. */
const LEASE_EXPIRED = `(NOT r.paused AND r.status IN (${EXECUTING_SQL}) AND r.lease_expires_at < now())`;

/**
 * The oldest claimable run, held with SKIP LOCKED so other workers pass it by. It takes no
 * admission lock: claim_run takes the start locks and re-checks the rule, so claims far from the
 * ceilings commit (and flush) side by side instead of one at a time. The claim waits for its WAL
 * flush in strict mode; in relaxed mode it does not, as a claim lost in a database crash is
 * harmless (the run is claimed again) and the first durable commit flushes it.
 */
const selectCandidate = statement<CandidateParams & { synchronousCommit: "on" | "off" }, { id: string; status: RunStatus; agent_id: string; root: boolean }>(
  "claim_candidate",
)`
  WITH ${durabilityCte((p: { synchronousCommit: "on" | "off" }) => p.synchronousCommit)},
  ${raw(FACTS_SET_CTES)},
  candidate AS (
    SELECT r.id, r.status, r.agent_id, r.parent_run_id IS NULL AS root
    FROM runs r JOIN agents a ON a.id = r.agent_id LEFT JOIN executing e ON e.agent_id = r.agent_id
    -- The status test on its own lets the index pick the few claimable rows the rule then reads.
    WHERE r.status IN (${raw(CLAIMABLE_SQL)}) AND (${mayStartSql<CandidateParams>({ now }, FACTS_SET)} OR ${raw(LEASE_EXPIRED)})
    ORDER BY r.created_at
    LIMIT 1
    FOR NO KEY UPDATE OF r SKIP LOCKED)
  SELECT c.id, c.status, c.agent_id, c.root, d.setting FROM candidate c, durability d`;

interface ClaimParams extends CandidateParams {
  readonly runId: string;
  readonly workerId: string;
  readonly leaseMs: number;
  readonly queued: boolean;
  /** Whether the ceilings gate this start: a queued root run. */
  readonly rootStart: boolean;
  readonly agentId: string;
  readonly summary: string;
  readonly previousStatus: RunStatus;
}

/**
 * The start rule again under the start locks (taken by `locked` before the rule reads its counts),
 * the lease, its event and the run's input, in one statement.
 * A fork (run-fork.repository.ts) is offered the tools of its source's connector; its emissions stay its own.
 */
const claimRun = statement<ClaimParams, ClaimRow>("claim_run")`
  WITH locked AS ${claimStartLocksSql<ClaimParams>((p) => p.agentId, (p) => p.rootStart)},
  claimed AS (
    UPDATE runs r SET
      status = 'running', lease_owner = ${(p) => p.workerId}, lease_epoch = r.lease_epoch + 1,
      lease_expires_at = now() + make_interval(secs => ${(p) => p.leaseMs}::int / 1000.0),
      started_at = coalesce(r.started_at, ${now}::timestamptz), updated_at = now(), event_seq = r.event_seq + 1
    FROM agents a LEFT JOIN locked ON true
    WHERE r.id = ${(p) => p.runId}::uuid AND a.id = r.agent_id
      AND CASE WHEN ${(p) => p.queued}::boolean THEN ${mayStartSql<ClaimParams>({ now }, FACTS_LOCKED)}
        ELSE ${raw(LEASE_EXPIRED)} END
    RETURNING r.id, r.status, r.lease_epoch, r.step_count, r.usage, r.connector, r.started_at, r.event_seq,
      r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.requested_by_actor_id, r.reply_to_message_id, r.commit_boundary,
      coalesce(r.logical_request_id, r.id) AS logical_request_id, r.trigger_count, r.inherits_from_run_id, r.conversation_id,
      a.spec || coalesce(r.spec_override, '{}'::jsonb) AS spec, r.parent_run_id,
      coalesce((SELECT f.connector FROM runs f WHERE f.id = r.forked_from_run_id), r.connector) AS tools_connector),
  event AS (
    INSERT INTO run_events (run_id, seq, kind, status, summary)
    SELECT id, event_seq, 'status_changed', 'running', ${(p) => p.summary}::text || ' at epoch ' || lease_epoch FROM claimed)
  SELECT claimed.id, claimed.lease_epoch, claimed.step_count, claimed.usage, claimed.tools_connector AS connector, claimed.started_at,
    claimed.cancel_requested_by_actor_id, claimed.superseded_by_run_id, claimed.requested_by_actor_id, claimed.reply_to_message_id,
    claimed.commit_boundary, claimed.logical_request_id, claimed.trigger_count, claimed.inherits_from_run_id, claimed.conversation_id, claimed.spec,
    claimed.parent_run_id,
    ${(p) => p.previousStatus}::text AS previous_status,
    (${raw(triggersSql("claimed.id"))}) AS messages
  FROM claimed`;

const nextDue = statement<{ now: Date }, { due: Date | null }>("claim_next_due", { plans: "generic" })`
  SELECT min(not_before) AS due FROM runs WHERE status = 'queued' AND NOT paused AND not_before > ${now}::timestamptz`;

export interface RunClaimOptions {
  /** Coalesce windows and admission are decided on this clock, not the database's. */
  readonly clock?: Clock;
  /** Whether claims wait for their WAL flush (strict, the default) or not (relaxed). */
  readonly durability?: Durability;
}

/** A claim's row as the runner takes it. */
function claimedRun(claimed: ClaimRow): ClaimedRun {
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
    conversationId: claimed.conversation_id,
    ...(claimed.parent_run_id === null ? {} : { parentRunId: claimed.parent_run_id }),
  };
}

/**
 * Claims queued root run `runId` for `workerId` inside the caller's transaction, under the same
 * start rule as any claim (a ceiling or a pause leaves it queued: undefined). A WorkGraph pass
 * uses it to hand a root its turn on an idle worker of this process.
 */
export async function claimQueuedRoot(
  trx: SqlTransaction,
  claim: { readonly runId: string; readonly agentId: string; readonly workerId: string; readonly leaseMs: number; readonly now: Date; readonly why: string },
): Promise<ClaimedRun | undefined> {
  const [claimed] = await trx.run(claimRun, {
    now: claim.now,
    runId: claim.runId,
    workerId: claim.workerId,
    leaseMs: claim.leaseMs,
    queued: true,
    rootStart: true,
    agentId: claim.agentId,
    summary: `claimed by ${claim.workerId} (${claim.why})`,
    previousStatus: "queued",
  });
  if (claimed === undefined) return undefined;
  trx.notify("keel_run_events", claimed.id);
  return claimedRun(claimed);
}

/**
 * A worker that ends a run looks for the next at once, and mostly finds none: planned afresh each
 * time, that look cost PostgreSQL 0.7 ms of CPU. Generic plans (ledger-statements.test.ts reads them).
 */
const CLAIM_PLANS = { plans: "generic" } as const;

/** A candidate the start rule let through that the claim, under the start locks, did not start. */
const HELD_BACK = Symbol("held back");

/**
 * How often a worker looks again after its candidate was held back. Near a ceiling a start
 * holding a slot counts every other slot as taken (the margin), so a start that committed while
 * it waited for the admission lock can hold it back though room is left; looking again counts
 * exactly (the exclusive lock); otherwise the run would wait for another run to end or the idle
 * poll. A start really held back (its conversation, a full ceiling) is no longer a candidate, so
 * the next look finds another or none. Admission's held-back starts stay queued and come here.
 */
const CLAIM_ATTEMPTS = 3;

export function createRunClaimRepository(sql: Sql, options: RunClaimOptions = {}): Pick<RunStore, "claimNext" | "nextDueAt"> {
  const clock = options.clock ?? systemClock;
  const synchronousCommit = replayableCommit(options.durability ?? "strict");
  const claimInTransaction = (workerId: string, leaseMs: number) =>
    sql.transaction(async (trx): Promise<ClaimedRun | typeof HELD_BACK | undefined> => {
      const at = clock.now();
      const [candidate] = await trx.run(selectCandidate, { now: at, synchronousCommit });
      if (candidate === undefined) return undefined;
      const queued = candidate.status === "queued";
      const [claimed] = await trx.runLast(claimRun, {
        now: at,
        runId: candidate.id,
        workerId,
        leaseMs,
        queued,
        rootStart: queued && candidate.root,
        agentId: candidate.agent_id,
        summary: queued ? `claimed by ${workerId}` : `lease expired while ${candidate.status}; reclaimed by ${workerId}`,
        previousStatus: candidate.status,
      });
      // Held back under the start locks: another start got in first, or only seemed to (below).
      if (claimed === undefined) return HELD_BACK;
      trx.notify("keel_run_events", claimed.id);
      return claimedRun(claimed);
    }, undefined, CLAIM_PLANS);
  return {
    async claimNext(workerId, leaseMs) {
      for (let attempt = 1; ; attempt++) {
        const claimed = await claimInTransaction(workerId, leaseMs);
        if (claimed !== HELD_BACK) return claimed;
        if (attempt === CLAIM_ATTEMPTS) return undefined;
      }
    },

    async nextDueAt() {
      const [row] = await sql.run(nextDue, { now: clock.now() });
      return optionalDate(row?.due);
    },
  };
}
