// Writes that several transactions share: the run's event sequence and emission reservations.
import { randomUUID } from "node:crypto";
import type { EmissionDraft } from "../domain/records.js";
import type { CommitBoundary, RunEventKind, RunStatus } from "../domain/run.js";
import { cancellationReply, settlementDrafts, type WorkDone } from "../domain/settlement.js";
import { fragment, raw, statement, type SqlTransaction } from "./sql.js";

export interface RunEventDraft {
  readonly kind: RunEventKind;
  readonly status?: RunStatus;
  readonly stepId?: string;
  readonly toolInvocationId?: string;
  readonly summary: string;
}

/**
 * Appends events with dense per-run sequence numbers, inside the caller's transaction, and wakes
 * watchers once it commits: the numbers are reserved on the run row and the rows inserted in one statement.
 */
const appendEvents = statement<{ runId: string; count: number; events: string }, { found: number }>("run_append_events")`
  WITH reserved AS (
    UPDATE runs SET event_seq = event_seq + ${(p) => p.count}::int WHERE id = ${(p) => p.runId}::uuid RETURNING event_seq),
  inserted AS (
    INSERT INTO run_events (run_id, seq, kind, status, step_id, tool_invocation_id, summary)
    SELECT ${(p) => p.runId}::uuid, reserved.event_seq - ${(p) => p.count}::int + 1 + e.i, e.kind, e.status, e.step_id, e.tool_invocation_id, e.summary
    FROM reserved, jsonb_to_recordset(${(p) => p.events}::jsonb) AS e(i int, kind text, status text, step_id uuid, tool_invocation_id uuid, summary text)
    RETURNING 1)
  SELECT (SELECT count(*)::int FROM reserved) AS found FROM (SELECT count(*) FROM inserted) AS done`;

export async function appendRunEvents(trx: SqlTransaction, runId: string, events: readonly RunEventDraft[]): Promise<void> {
  if (events.length === 0) return;
  const rows = events.map((event, i) => ({
    i,
    kind: event.kind,
    status: event.status ?? null,
    step_id: event.stepId ?? null,
    tool_invocation_id: event.toolInvocationId ?? null,
    summary: event.summary,
  }));
  const [appended] = await trx.run(appendEvents, { runId, count: events.length, events: JSON.stringify(rows) });
  if (appended?.found !== 1) throw new Error(`run ${runId} vanished while appending events`);
  trx.notify("keel_run_events", runId);
}

/**
 * Emission order. Every writer holds this lock in shared mode from before it draws an emission's
 * seq until its commit; writers do not wait for each other. A reader takes it exclusively for an
 * instant and reads the sequence's last value: every seq up to that value was drawn by a writer
 * that has since committed or rolled back, so a snapshot taken afterwards holds every row it
 * will ever hold up to there, and a Subscribe cursor (`seq > n`) that reads no further never
 * skips a row committed late (see emission-feed.ts).
 */
export const EMISSION_SEQUENCE_LOCK = 7234001;

export interface EmissionTarget {
  readonly runId: string;
  readonly agentId: string;
  readonly conversationId: string;
  readonly externalConversationId: string;
  readonly connector: string;
}

/** Emission drafts as the JSON rows `emissionInsert` reads (the run's own columns come from its target). */
export interface EmissionRowsParams {
  readonly emissions: string;
}

/** The rows emissionRows writes, read back as `e` from jsonb_to_recordset. */
export const EMISSION_RECORD = "e(id uuid, idempotency_key text, kind text, reply_to_message_id text, text text, ack_state text, addressed_actor_ids jsonb)";
/** The insert every emission reservation shares: the SELECT after it gives the columns in this order. */
export const EMISSION_INSERT = `INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id,
      external_conversation_id, reply_to_message_id, text, ack_state, addressed_actor_ids)`;

export function emissionRows(drafts: readonly EmissionDraft[]): string {
  return JSON.stringify(
    drafts.map((draft) => ({
      id: randomUUID(),
      idempotency_key: draft.idempotencyKey,
      kind: draft.kind,
      reply_to_message_id: draft.replyToMessageId ?? null,
      text: draft.text,
      ack_state: draft.ackState ?? null,
      addressed_actor_ids: draft.addressedActorIds,
    })),
  );
}

/**
 * CTEs that reserve emissions for the run in a CTE named `target` (id, agent_id,
 * conversation_id, external_conversation_id, connector), so a statement that fences or locks its
 * run reserves them in the same round trip. The rows are selected FROM the lock, so no seq is
 * drawn before it is held, in shared mode, so concurrent writers do not queue behind each other;
 * with no drafts (or no target) the lock is not taken. A key already reserved is skipped, so a
 * retried worker never emits twice; `inserted` returns the new rows' ids.
 */
export const emissionInsert = fragment<EmissionRowsParams>`
  ordered AS (SELECT pg_advisory_xact_lock_shared(${raw(String(EMISSION_SEQUENCE_LOCK))}) AS held
    FROM target WHERE ${(p) => p.emissions}::jsonb <> '[]'::jsonb),
  inserted AS (
    ${raw(EMISSION_INSERT)}
    SELECT e.id, e.idempotency_key, t.connector, e.kind, t.id, t.agent_id, t.conversation_id, t.external_conversation_id,
      e.reply_to_message_id, e.text, e.ack_state, e.addressed_actor_ids
    FROM target t, ordered, jsonb_to_recordset(${(p) => p.emissions}::jsonb) AS ${raw(EMISSION_RECORD)}
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id)`;

const reserveEmissionRows = statement<EmissionRowsParams & { target: EmissionTarget }, { n: number }>("emission_reserve")`
  WITH target AS (
    SELECT ${(p) => p.target.runId}::uuid AS id, ${(p) => p.target.agentId}::text AS agent_id, ${(p) => p.target.conversationId}::uuid AS conversation_id,
      ${(p) => p.target.externalConversationId}::text AS external_conversation_id, ${(p) => p.target.connector}::text AS connector),
  ${emissionInsert}
  SELECT count(*)::int AS n FROM inserted`;

/**
 * Reserves emissions by idempotency key inside the caller's transaction (see emissionInsert);
 * the shared emission-order lock is held until its commit (EMISSION_SEQUENCE_LOCK). Returns how
 * many were new.
 */
export async function reserveEmissions(trx: SqlTransaction, target: EmissionTarget, drafts: readonly EmissionDraft[]): Promise<number> {
  if (drafts.length === 0) return 0;
  const [reserved] = await trx.run(reserveEmissionRows, { target, emissions: emissionRows(drafts) });
  const n = reserved?.n ?? 0;
  if (n > 0) trx.notify("keel_emissions", target.connector);
  return n;
}

/** What ending a run that no worker holds needs to know about it. */
export interface ParkedRunStop extends EmissionTarget {
  readonly replyToMessageId: string | null;
  readonly logicalRequestId: string;
  readonly commitBoundary: CommitBoundary;
  readonly addressedActorIds: readonly string[];
  readonly actorId: string;
  readonly reason: string;
  /** A superseded run ends without a word: its successor answers and settles the request's ack. */
  readonly supersededBy?: string;
}

/**
 * Ends a run that is queued, awaiting input or waiting, at once. Past the commit boundary the
 * reply says what was already done; in every case but supersession the request's ack settles
 * as failed. Wakes a worker: the conversation's next run may start now.
 */
const stopRun = statement<{ runId: string; actorId: string; reason: string; supersededBy: string | null }>("run_stop_parked")`
  UPDATE runs SET status = 'cancelled', wait_reason = NULL, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
    cancel_requested_by_actor_id = coalesce(cancel_requested_by_actor_id, ${(q) => q.actorId}), cancel_reason = coalesce(cancel_reason, ${(q) => q.reason}),
    superseded_by_run_id = coalesce(${(q) => q.supersededBy}::uuid, superseded_by_run_id), updated_at = now()
  WHERE id = ${(q) => q.runId}::uuid`;

/** The steps a stopped run took and the writes that took effect, for its partial-result reply. */
const workDone = statement<{ runId: string }, { steps: number; effects: string[] | null }>("run_work_done")`
  SELECT (SELECT count(*)::int FROM run_steps WHERE run_id = ${(q) => q.runId}::uuid) AS steps,
    (SELECT json_agg(tool_name ORDER BY created_at) FROM tool_invocations
     WHERE run_id = ${(q) => q.runId}::uuid AND effect = 'write' AND (status = 'succeeded' OR resolved_outcome = 'applied')) AS effects`;

export async function stopParkedRun(trx: SqlTransaction, stop: ParkedRunStop): Promise<void> {
  await trx.run(stopRun, { runId: stop.runId, actorId: stop.actorId, reason: stop.reason, supersededBy: stop.supersededBy ?? null });
  await appendRunEvents(trx, stop.runId, [
    {
      kind: "status_changed",
      status: "cancelled",
      summary: stop.supersededBy === undefined ? `cancelled by ${stop.actorId}: ${stop.reason}` : `superseded by run ${stop.supersededBy}: ${stop.reason}`,
    },
  ]);
  trx.notify("keel_runs", stop.runId);
  if (stop.supersededBy !== undefined) return;
  let done: WorkDone = { stepsDone: 0, effects: [] };
  if (stop.commitBoundary === "committed") {
    const [row] = await trx.run(workDone, stop);
    done = { stepsDone: row?.steps ?? 0, effects: row?.effects ?? [] };
  }
  const audience = { ...stop, replyToMessageId: stop.replyToMessageId ?? undefined };
  const drafts = settlementDrafts(audience, "cancelled", cancellationReply(stop.commitBoundary, stop.actorId, () => done));
  await reserveEmissions(trx, stop, drafts);
}
