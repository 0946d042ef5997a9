// The writes of an admission plan that create or stop runs: SQL only; admission decides.
import { randomUUID } from "node:crypto";
import type { ConversationAddress, ConversationLedger, IncomingMessage, NewRunDraft, RunStopDraft, TriggerDraft } from "../conversation/admission-ledger.js";
import { ZERO_USAGE } from "../domain/run.js";
import { EMISSION_INSERT, EMISSION_RECORD, EMISSION_SEQUENCE_LOCK, emissionRows, stopParkedRun } from "./ledger-writes.js";
import { admissionStartSql } from "./run-start.sql.js";
import { raw, statement, type SqlTransaction } from "./sql.js";

interface InsertRunParams {
  readonly address: ConversationAddress;
  readonly run: NewRunDraft;
  readonly now: Date;
  readonly ackId: string;
}
const runId = (p: InsertRunParams) => p.run.runId;
const claim = (p: InsertRunParams) => p.run.claim;
const incoming = (p: InsertRunParams) => p.run.trigger.incoming;

/**
 * A root run with its triggers (carried over from `carryTriggersOf` first), its first event and,
 * for a new logical request, its working ack, in one statement. With a claim and room under both
 * ceilings (admissionStartSql takes the locks and counts), the run is inserted running, leased to
 * the reserved worker at epoch 1; otherwise it is queued and a worker is woken (after the commit,
 * as every watcher: see Sql.notify). A run it starts gets its start acks too, which its worker
 * would otherwise reserve in a transaction of its own. The acks draw their seqs only once the
 * emission-order lock is held in shared mode (they select from the lock). A triage known at
 * admission is stored with the run; otherwise its columns wait for the triager.
 */
const insertRunStatement = statement<InsertRunParams, { started: boolean; acked: boolean }>("admission_insert_run")`
  WITH start AS (
    SELECT CASE WHEN ${(p) => claim(p) !== undefined}::boolean THEN ${admissionStartSql<InsertRunParams>()} ELSE false END AS go
    FROM agents a WHERE a.id = ${(p) => p.address.agent.id}),
  carried AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
    SELECT ${runId}::uuid, t.message_id, t.actor_id, t.external_message_id, t.received_at, t.relation, 0, true,
      row_number() OVER (ORDER BY t.ordinal, t.received_at)
    FROM run_triggers t WHERE t.run_id = ${(p) => p.run.carryTriggersOf ?? null}::uuid AND t.relation <> 'cancels'
    RETURNING message_id),
  counted AS (SELECT count(*)::int AS n FROM carried),
  new_run AS (
    INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage,
      logical_request_id, request_received_at, interruptions, inherits_from_run_id, continuation_of_run_id, not_before,
      trigger_count, event_seq, lease_owner, lease_epoch, lease_expires_at, started_at,
      triage_duration, triage_shape, triage_ack_text, triage_fallback)
    SELECT ${runId}::uuid, ${(p) => p.address.agent.id}, ${(p) => p.address.conversationId}::uuid, ${(p) => p.run.connector},
      CASE WHEN start.go THEN 'running' ELSE 'queued' END, ${(p) => p.run.requesterId}, ${(p) => p.run.replyToMessageId},
      ${(p) => JSON.stringify(p.address.agent.budget)}::jsonb, ${raw(`'${JSON.stringify(ZERO_USAGE)}'::jsonb`)},
      ${(p) => p.run.logicalRequestId}::uuid, ${(p) => p.run.requestReceivedAt}::timestamptz, ${(p) => p.run.interruptions}::int,
      ${(p) => p.run.inheritsFromRunId ?? null}::uuid, ${(p) => p.run.continuationOfRunId ?? null}::uuid, ${(p) => p.run.notBefore}::timestamptz,
      counted.n + 1, CASE WHEN start.go THEN 2 ELSE 1 END, CASE WHEN start.go THEN ${(p) => claim(p)?.workerId ?? null}::text END,
      CASE WHEN start.go THEN 1 ELSE 0 END,
      CASE WHEN start.go THEN now() + make_interval(secs => ${(p) => claim(p)?.leaseMs ?? 0}::int / 1000.0) END,
      CASE WHEN start.go THEN ${(p) => p.now}::timestamptz END,
      ${(p) => p.run.triage?.triage.duration ?? null}, ${(p) => p.run.triage?.triage.shape ?? null},
      ${(p) => p.run.triage?.triage.ackText ?? null}, ${(p) => p.run.triage?.fellBack ?? null}
    FROM counted, start),
  own AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
    SELECT ${runId}::uuid, ${(p) => incoming(p).rowId}::uuid, ${(p) => incoming(p).actorId}, ${(p) => incoming(p).externalId},
      ${(p) => p.now}::timestamptz, ${(p) => p.run.trigger.relation}, 0, false, counted.n + 1 FROM counted),
  moved AS (
    UPDATE messages SET run_id = ${runId}::uuid
    WHERE id IN (SELECT ${(p) => incoming(p).rowId}::uuid
                 UNION ALL SELECT message_id FROM carried WHERE ${(p) => p.run.moveCarriedMessages === true}::boolean)),
  event AS (
    INSERT INTO run_events (run_id, seq, kind, status, summary)
    SELECT ${runId}::uuid, 1, 'created', 'queued', ${(p) => p.run.summary}
    UNION ALL SELECT ${runId}::uuid, 2, 'status_changed', 'running', 'claimed by ' || ${(p) => claim(p)?.workerId ?? ""}::text || ' at epoch 1'
    FROM start WHERE start.go),
  ack_lock AS (SELECT pg_advisory_xact_lock_shared(${raw(String(EMISSION_SEQUENCE_LOCK))}) AS held
    WHERE ${(p) => p.run.ack !== undefined || (p.run.startAcks?.length ?? 0) > 0}::boolean),
  ack AS (
    ${raw(EMISSION_INSERT)}
    SELECT ${(p) => p.ackId}::uuid, ${(p) => p.run.ack?.idempotencyKey ?? ""}, ${(p) => p.run.connector}, 'ack', ${runId}::uuid,
      ${(p) => p.address.agent.id}, ${(p) => p.address.conversationId}::uuid, ${(p) => p.address.externalConversationId},
      ${(p) => p.run.ack?.messageId ?? null}, ${(p) => p.run.ack?.text ?? ""}, 'working',
      ${(p) => JSON.stringify(p.run.ack === undefined ? [] : [p.run.ack.actorId])}::jsonb
    FROM ack_lock WHERE ${(p) => p.run.ack !== undefined}::boolean
    UNION ALL
    SELECT e.id, e.idempotency_key, ${(p) => p.run.connector}, e.kind, ${runId}::uuid,
      ${(p) => p.address.agent.id}, ${(p) => p.address.conversationId}::uuid, ${(p) => p.address.externalConversationId},
      e.reply_to_message_id, e.text, e.ack_state, e.addressed_actor_ids
    FROM ack_lock, start, jsonb_to_recordset(${(p) => emissionRows(p.run.startAcks ?? [])}::jsonb) AS ${raw(EMISSION_RECORD)}
    WHERE start.go
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id)
  SELECT start.go AS started, EXISTS (SELECT FROM ack) AS acked FROM start`;

interface TriggerParams {
  readonly runId: string;
  readonly incoming: IncomingMessage;
  readonly relation: string;
  readonly amends: boolean;
  readonly notBefore: Date | null;
  readonly now: Date;
}
const addTriggerStatement = statement<TriggerParams>("admission_add_trigger")`
  WITH trigger AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
    SELECT r.id, ${(p) => p.incoming.rowId}::uuid, ${(p) => p.incoming.actorId}, ${(p) => p.incoming.externalId}, ${(p) => p.now}::timestamptz,
      ${(p) => p.relation}, CASE WHEN ${(p) => p.amends}::boolean THEN r.step_count ELSE 0 END, false, r.trigger_count + 1
    FROM runs r WHERE r.id = ${(p) => p.runId}::uuid)
  UPDATE runs SET trigger_count = trigger_count + 1, interruptions = interruptions + ${(p) => (p.amends ? 1 : 0)}::int,
    not_before = coalesce(${(p) => p.notBefore}::timestamptz, not_before), updated_at = now()
  WHERE id = ${(p) => p.runId}::uuid`;

interface CancelParams {
  readonly runId: string;
  readonly incoming: IncomingMessage;
  readonly reason: string;
  readonly now: Date;
}
const addCancelTriggerStatement = statement<CancelParams>("admission_add_cancel_trigger")`
  WITH trigger AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
    SELECT r.id, ${(p) => p.incoming.rowId}::uuid, ${(p) => p.incoming.actorId}, ${(p) => p.incoming.externalId}, ${(p) => p.now}::timestamptz,
      'cancels', r.step_count, false, r.trigger_count + 1
    FROM runs r WHERE r.id = ${(p) => p.runId}::uuid)
  UPDATE runs SET cancel_requested_by_actor_id = ${(p) => p.incoming.actorId}, cancel_reason = ${(p) => p.reason},
    trigger_count = trigger_count + 1, updated_at = now()
  WHERE id = ${(p) => p.runId}::uuid`;

interface StopParams {
  readonly runId: string;
  readonly actorId: string;
  readonly reason: string;
  readonly supersededBy: string | null;
}
const requestStopStatement = statement<StopParams>("admission_request_stop")`
  UPDATE runs SET superseded_by_run_id = coalesce(${(p) => p.supersededBy}::uuid, superseded_by_run_id),
    cancel_requested_by_actor_id = ${(p) => p.actorId}, cancel_reason = ${(p) => p.reason}, updated_at = now()
  WHERE id = ${(p) => p.runId}::uuid`;

export function runAdmissionWrites(trx: SqlTransaction): Pick<ConversationLedger, "insertRun" | "addTrigger" | "addCancelTrigger" | "stopParkedRun" | "requestStop"> {
  return {
    async insertRun(address, run, now) {
      // A started run is the admission's last write (the port says so): its COMMIT goes with it.
      const params = { address, run, now, ackId: randomUUID() };
      const [inserted] = await (run.claim === undefined ? trx.run(insertRunStatement, params) : trx.runLast(insertRunStatement, params));
      if (inserted === undefined) throw new Error(`agent ${address.agent.id} vanished while admitting run ${run.runId}`);
      trx.notify("keel_run_events", run.runId);
      if (!inserted.started) trx.notify("keel_runs", run.runId);
      if (inserted.acked) trx.notify("keel_emissions", run.connector);
      return run.claim !== undefined && inserted.started;
    },
    async addTrigger(runId, incoming, how: TriggerDraft, now) {
      await trx.run(addTriggerStatement, { runId, incoming, relation: how.relation, amends: how.amends, notBefore: how.notBefore ?? null, now });
    },
    async addCancelTrigger(runId, incoming, reason, now) {
      await trx.run(addCancelTriggerStatement, { runId, incoming, reason, now });
    },
    async stopParkedRun(address, stop: RunStopDraft) {
      await stopParkedRun(trx, {
        runId: stop.run.id,
        agentId: address.agent.id,
        conversationId: address.conversationId,
        externalConversationId: address.externalConversationId,
        connector: stop.run.connector,
        replyToMessageId: stop.run.replyToMessageId ?? null,
        logicalRequestId: stop.run.logicalRequestId,
        commitBoundary: stop.run.commitBoundary,
        addressedActorIds: stop.addressedActorIds,
        actorId: stop.actorId,
        reason: stop.reason,
        ...(stop.supersededBy === undefined ? {} : { supersededBy: stop.supersededBy }),
      });
    },
    async requestStop(stop) {
      await trx.run(requestStopStatement, { runId: stop.run.id, actorId: stop.actorId, reason: stop.reason, supersededBy: stop.supersededBy ?? null });
    },
  };
}
