// Operator forks (RunService.ForkRun): a new root run that inherits a source run's transcript up
// to and including one committed step, with a fresh budget. SQL only; the run-history repository
// reads the inherited prefix back when the fork is claimed.
import { randomUUID } from "node:crypto";
import { systemClock, type Clock } from "../domain/clock.js";
import { FailedPreconditionError, NotFoundError } from "../domain/errors.js";
import { inheritablePrefix } from "../domain/interrupt.js";
import { ZERO_USAGE, type RunStatus } from "../domain/run.js";
import { appendRunEvents } from "./ledger-writes.js";
import { stepsOf } from "./run-history.repository.js";
import { raw, statement, type Sql } from "./sql.js";

/**
 * A fork's emissions (its ack, progress and reply) are keyed to this connector, which no real
 * connector serves: an operator's experiment is recorded in the ledger, never posted into the
 * source's conversation. Its tools are still those of the source's connector (run-claim).
 */
export const FORK_CONNECTOR = "keel-fork";

export interface ForkRequest {
  readonly sourceRunId: string;
  readonly stepIndex: number;
  readonly actorId: string;
  readonly reason: string;
}

export interface RunForks {
  /** Inserts the fork, queued, and returns its id. */
  fork(request: ForkRequest): Promise<string>;
}

interface SourceRow {
  status: RunStatus;
  agent_id: string;
  step_count: number;
}

const lockSource = statement<{ runId: string }, SourceRow>("fork_lock_source")`
  SELECT r.status, r.agent_id, r.step_count FROM runs r WHERE r.id = ${(p) => p.runId}::uuid FOR KEY SHARE OF r`;

const ensureActor = statement<{ actorId: string }>("fork_ensure_actor")`
  INSERT INTO actors (id) VALUES (${(p) => p.actorId}) ON CONFLICT (id) DO NOTHING`;

interface InsertForkParams {
  readonly forkId: string;
  readonly conversationId: string;
  readonly sourceRunId: string;
  readonly stepIndex: number;
  /** Own steps of the source that the fork keeps: a message that arrived after more of them is left out. */
  readonly stepsKept: number;
  readonly actorId: string;
  readonly reason: string;
  readonly summary: string;
  /** Due now on Keel's clock, which the claim's start rule reads (not the database's). */
  readonly notBefore: Date;
}

/**
 * The fork's private conversation, its run (queued, the agent's current budget, nothing used) and
 * the source's triggers as inherited input, in one statement; a worker is woken.
 */
const insertFork = statement<InsertForkParams, { id: string }>("fork_insert_run")`
  WITH source AS (SELECT r.agent_id, a.spec->'budget' AS budget FROM runs r JOIN agents a ON a.id = r.agent_id
    WHERE r.id = ${(p) => p.sourceRunId}::uuid),
  conversation AS (
    INSERT INTO conversations (id, agent_id, external_id, connector)
    SELECT ${(p) => p.conversationId}::uuid, source.agent_id, 'fork-' || ${(p) => p.forkId}::text, ${raw(`'${FORK_CONNECTOR}'`)} FROM source
    RETURNING id),
  carried AS (
    SELECT t.message_id, t.actor_id, t.external_message_id, t.received_at, t.relation,
      row_number() OVER (ORDER BY t.inherited DESC, t.ordinal, t.received_at) AS ordinal
    FROM run_triggers t WHERE t.run_id = ${(p) => p.sourceRunId}::uuid AND t.relation <> 'cancels'
      AND (t.inherited OR t.after_step <= ${(p) => p.stepsKept}::int)),
  new_run AS (
    INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, logical_request_id,
      request_received_at, inherits_from_run_id, forked_from_run_id, forked_at_step, fork_reason, trigger_count, event_seq, not_before)
    SELECT ${(p) => p.forkId}::uuid, source.agent_id, conversation.id, ${raw(`'${FORK_CONNECTOR}'`)}, 'queued', ${(p) => p.actorId},
      source.budget, ${raw(`'${JSON.stringify(ZERO_USAGE)}'::jsonb`)}, ${(p) => p.forkId}::uuid, now(), ${(p) => p.sourceRunId}::uuid,
      ${(p) => p.sourceRunId}::uuid, ${(p) => p.stepIndex}::int, ${(p) => p.reason}, (SELECT count(*)::int FROM carried), 1,
      ${(p) => p.notBefore}::timestamptz
    FROM source, conversation
    RETURNING id),
  triggers AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
    SELECT new_run.id, c.message_id, c.actor_id, c.external_message_id, c.received_at, c.relation, 0, true, c.ordinal
    FROM new_run, carried c),
  event AS (
    INSERT INTO run_events (run_id, seq, kind, status, summary) SELECT new_run.id, 1, 'created', 'queued', ${(p) => p.summary} FROM new_run)
  SELECT new_run.id, pg_notify('keel_runs', new_run.id::text), pg_notify('keel_run_events', new_run.id::text) FROM new_run`;

export function createRunForkRepository(sql: Sql, clock: Clock = systemClock): RunForks {
  return {
    fork: ({ sourceRunId, stepIndex, actorId, reason }) =>
      sql.transaction(async (trx) => {
        const [source] = await trx.run(lockSource, { runId: sourceRunId });
        if (source === undefined) throw new NotFoundError("run", sourceRunId);
        const steps = (await stepsOf(trx, sourceRunId)).filter((step) => step.index <= stepIndex);
        if (!steps.some((step) => step.index === stepIndex)) {
          throw new FailedPreconditionError(`run ${sourceRunId} has no committed step ${stepIndex} (it has ${source.step_count} steps)`);
        }
        // The same rule a continuation inherits by: a step whose calls a stop cut short cannot be a starting point.
        const kept = inheritablePrefix(steps, "all_settled");
        if (kept.length < steps.length) {
          const cut = steps[kept.length]!;
          throw new FailedPreconditionError(`run ${sourceRunId} step ${cut.index} has a tool call without a settled outcome; fork from an earlier step`);
        }
        const forkId = randomUUID();
        await trx.run(ensureActor, { actorId });
        const [inserted] = await trx.run(insertFork, {
          forkId,
          conversationId: randomUUID(),
          sourceRunId,
          stepIndex,
          stepsKept: steps.length,
          actorId,
          reason,
          summary: `forked from run ${sourceRunId} at step ${stepIndex} by ${actorId}: ${reason}`,
          notBefore: clock.now(),
        });
        if (inserted === undefined) throw new NotFoundError("run", sourceRunId);
        await appendRunEvents(trx, sourceRunId, [{ kind: "status_changed", status: source.status, summary: `forked at step ${stepIndex} into run ${forkId} by ${actorId}: ${reason}` }]);
        return forkId;
      }),
  };
}
