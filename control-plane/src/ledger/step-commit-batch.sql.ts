// Several runs' fenced commits as ONE statement: the set-oriented form of fencedCommit
// (step-commit.sql.ts), for a group-commit batch. Each commit is a row of one JSON array; every
// write joins that row to its own run's fence, so a commit whose lease is gone matches nothing and
// writes nothing while the others in the batch go on. PostgreSQL sets up the plan, opens the
// tables and their indexes, and parses the parameters once for the batch instead of once per run.
import {
  ARTIFACT_INSERT,
  ARTIFACT_RECORD,
  EVENT_INSERT,
  EVENT_RECORD,
  INTENT_INSERT,
  INTENT_RECORD,
  OUTCOME_RECORD,
  SETTLE_CALL,
  STEP_INSERT,
  shapeOf,
  type FenceRow,
  type FencedCommitParams,
  type FencedCommitShape,
} from "./step-commit.sql.js";
import { EMISSION_INSERT, EMISSION_RECORD, EMISSION_SEQUENCE_LOCK } from "./ledger-writes.js";
import { fragment, raw, statement } from "./sql.js";
import { durabilityCte } from "./server-durability.js";

export interface FencedBatchParams {
  readonly synchronousCommit: "on" | "off";
  /** The commits, a JSON array of batchRow()s in the order they were queued. */
  readonly commits: string;
  /** Their runs and the calls they settle, as arrays: the rows are found by key. */
  readonly runIds: readonly string[];
  readonly outcomeIds: readonly string[];
}

export interface FencedBatchRow extends FenceRow {
  /** Which commit of the batch this row answers (its index in `commits`). */
  readonly ord: number;
}

/** Scalars of a commit, by batch column; the JSON-valued ones are spliced in as they were serialised. */
const SCALARS = {
  run_id: "runId",
  worker_id: "workerId",
  epoch: "epoch",
  status: "status",
  final_reply: "finalReply",
  error: "error",
  exhausted_dimension: "exhaustedDimension",
  wait_reason: "waitReason",
  crosses: "crossesCommitBoundary",
  terminal: "terminal",
  keeps_lease: "keepsLease",
  guarded: "guarded",
  guard_trigger_count: "guardTriggerCount",
  has_step: "hasStep",
  step_id: "stepId",
  step_index: "stepIndex",
  replayability: "replayability",
  actor_id: "actorId",
  feedback: "feedback",
  started_at: "startedAt",
  call_id: "callId",
  role: "role",
  provider: "provider",
  model: "model",
  response_text: "responseText",
  input_tokens: "inputTokens",
  output_tokens: "outputTokens",
  latency_ms: "latencyMs",
  finish_reason: "finishReason",
  cost_micro_usd: "costMicroUsd",
  event_count: "eventCount",
  step_event_summary: "stepEventSummary",
  wakes_worker: "wakesWorker",
  frees_slot: "freesSlot",
} as const satisfies Record<string, keyof FencedCommitParams>;

const JSON_VALUED = {
  usage: "usage",
  request: "request",
  tool_calls: "toolCalls",
  intents: "intents",
  outcomes: "outcomes",
  artifacts: "artifacts",
  events: "events",
  emissions: "emissions",
} as const satisfies Record<string, keyof FencedCommitParams>;

const SCALAR_ENTRIES = Object.entries(SCALARS);
/** `,"column":` before each JSON-valued field, spliced after the scalars' object. */
const JSON_VALUED_ENTRIES = Object.entries(JSON_VALUED).map(([column, key]) => [`,${JSON.stringify(column)}:`, key] as const);

/** One commit as a row of the batch's JSON array: its scalars in one stringify, its JSON parts as serialised. */
export function batchRow(params: FencedCommitParams, ord: number): string {
  const scalars: Record<string, unknown> = { ord };
  for (const [column, key] of SCALAR_ENTRIES) scalars[column] = params[key];
  let row = JSON.stringify(scalars).slice(0, -1);
  for (const [prefix, key] of JSON_VALUED_ENTRIES) row += prefix + (params[key] ?? "null");
  return `${row}}`;
}

/** The batch's parameters: its commits in order, their runs and settled calls. */
export function fencedBatchParams(batch: readonly FencedCommitParams[], synchronousCommit: "on" | "off"): FencedBatchParams {
  return {
    synchronousCommit,
    commits: `[${batch.map(batchRow).join(",")}]`,
    runIds: batch.map((params) => params.runId),
    outcomeIds: batch.flatMap((params) => params.outcomeIds),
  };
}

const COMMIT_RECORD = `c(ord int, run_id uuid, worker_id text, epoch bigint, status text, usage jsonb, final_reply text, error text,
  exhausted_dimension text, wait_reason text, crosses boolean, terminal boolean, keeps_lease boolean, guarded boolean,
  guard_trigger_count int, has_step boolean, step_id uuid, step_index int, replayability text, actor_id text, feedback text,
  started_at timestamptz, call_id uuid, role text, provider text, model text, request jsonb, response_text text,
  tool_calls jsonb, input_tokens int, output_tokens int, latency_ms int, finish_reason text, cost_micro_usd bigint, event_count int,
  step_event_summary text, wakes_worker boolean, frees_slot boolean, intents jsonb, outcomes jsonb, artifacts jsonb, events jsonb, emissions jsonb)`;

/** The number of a commit's first event, as fencedCommit numbers it: each event's follows from its ordinal. */
const FIRST_SEQ = "(h.event_seq - h.event_count - CASE WHEN h.previous_status <> h.status THEN 1 ELSE 0 END + 1)";

/**
 * The batch: each commit's run locked, fenced and updated as fencedCommit does, then every
 * commit's step, call, intents, settled calls, artifacts, events and emissions
 * written FROM its fenced row. Runs are locked in key order, so two batches never wait on each
 * other in a cycle. Returns a row per commit that held its lease, with its `ord`. A batch whose
 * commits are all held leaves out the parts they do not use, as fencedHeldCommit does.
 */
function fencedBatchStatement(name: string, shape: FencedCommitShape) {
  const any = shape === "any";
  const none = fragment<FencedBatchParams>``;
  return statement<FencedBatchParams, FencedBatchRow>(name)`
  WITH ${durabilityCte<FencedBatchParams>((p) => p.synchronousCommit)},
  c AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(${(p) => p.commits}::jsonb) AS ${raw(COMMIT_RECORD)}),
  previous AS (SELECT id, status FROM runs WHERE id = ANY(${(p) => p.runIds}::uuid[]) ORDER BY id FOR NO KEY UPDATE),
  fence AS (
    UPDATE runs r SET status = c.status, usage = c.usage, step_count = r.step_count + CASE WHEN c.has_step THEN 1 ELSE 0 END,
      final_reply = coalesce(c.final_reply, r.final_reply), error = coalesce(c.error, r.error),
      exhausted_dimension = coalesce(c.exhausted_dimension, r.exhausted_dimension), wait_reason = c.wait_reason,
      commit_boundary = CASE WHEN c.crosses THEN 'committed' ELSE r.commit_boundary END,
      updated_at = now(), finished_at = CASE WHEN c.terminal THEN now() ELSE r.finished_at END,
      lease_owner = CASE WHEN c.keeps_lease THEN r.lease_owner ELSE NULL END,
      lease_expires_at = CASE WHEN c.keeps_lease THEN r.lease_expires_at ELSE NULL END,
      event_seq = r.event_seq + c.event_count + CASE WHEN previous.status <> c.status THEN 1 ELSE 0 END
    FROM c, previous, durability, ${any ? raw("conversations cv, ") : raw("")}agents a
    WHERE r.id = c.run_id AND previous.id = c.run_id AND ${any ? raw("cv.id = r.conversation_id AND ") : raw("")}a.id = r.agent_id
      AND r.lease_epoch = c.epoch AND r.lease_owner = c.worker_id
      AND (NOT c.guarded OR (r.cancel_requested_by_actor_id IS NULL AND (c.guard_trigger_count IS NULL OR r.trigger_count = c.guard_trigger_count)))
    RETURNING c.ord, r.id, previous.status AS previous_status, r.event_seq, r.agent_id, r.conversation_id, r.connector,
      ${any ? raw("cv.external_id") : raw("NULL::text AS external_id")}, r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.trigger_count, r.paused,
      a.policy, r.side_usage),
  held AS MATERIALIZED (SELECT fence.id, fence.previous_status, fence.event_seq, c.* FROM fence JOIN c ON c.ord = fence.ord),
  new_step AS (
    ${raw(STEP_INSERT)}
    SELECT h.step_id, h.id, h.step_index, h.replayability, h.status, h.actor_id, h.feedback, h.epoch, h.started_at,
      ${raw(FIRST_SEQ)} + h.event_count - 1, h.step_event_summary, h.call_id, h.role, h.provider, h.model, h.request, h.response_text,
      h.tool_calls, h.input_tokens, h.output_tokens, h.latency_ms, h.finish_reason, h.cost_micro_usd
    FROM held h WHERE h.has_step),
  new_intents AS (
    ${raw(INTENT_INSERT)}
    SELECT x.id, h.id, h.step_id, h.call_id, x.provider_call_id, x.ordinal, x.tool_name, x.tool_version, x.effect, x.arguments,
      x.status, x.refusal_reason, CASE WHEN x.status = 'refused' THEN now() END
    FROM held h, jsonb_to_recordset(h.intents) AS ${raw(INTENT_RECORD)}),
  -- Found by key, the run test kept off the run_id index (IS TRUE), as in fencedCommit.
  settled AS (
    UPDATE tool_invocations t SET ${raw(SETTLE_CALL)}, settled_seq = ${raw(FIRST_SEQ)} + x.event_ord
    FROM held h, jsonb_to_recordset(h.outcomes) AS ${raw(OUTCOME_RECORD)}
    WHERE t.id = ANY(${(p) => p.outcomeIds}::uuid[]) AND t.id = x.id AND (t.run_id = h.id) IS TRUE),
  ${any ? fragment<FencedBatchParams>`new_artifacts AS (
    ${raw(ARTIFACT_INSERT)}
    SELECT x.id, h.id, x.tool_invocation_id, x.type, x.schema_version, x.provenance, x.inline_data, x.reference,
      x.subject_artifact_id, x.conclusion
    FROM held h, jsonb_to_recordset(h.artifacts) AS ${raw(ARTIFACT_RECORD)}),` : none}
  new_events AS (
    ${raw(EVENT_INSERT)}
    SELECT h.id, ${raw(FIRST_SEQ)} + e.ord, e.kind, e.status, e.step_id, e.tool_invocation_id, e.summary
    FROM held h, jsonb_to_recordset(h.events) AS ${raw(EVENT_RECORD)}
    WHERE NOT e.only_on_change OR h.previous_status <> h.status)${any ? fragment<FencedBatchParams>`,
  ordered AS (SELECT pg_advisory_xact_lock_shared(${raw(String(EMISSION_SEQUENCE_LOCK))}) AS taken
    WHERE EXISTS (SELECT 1 FROM held h WHERE h.emissions <> '[]'::jsonb)),
  inserted AS (
    ${raw(EMISSION_INSERT)}
    SELECT e.id, e.idempotency_key, f.connector, e.kind, f.id, f.agent_id, f.conversation_id, f.external_id,
      e.reply_to_message_id, e.text, e.ack_state, e.addressed_actor_ids
    FROM fence f JOIN held h ON h.ord = f.ord, ordered, jsonb_to_recordset(h.emissions) AS ${raw(EMISSION_RECORD)}
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id),
  queued AS (SELECT EXISTS (SELECT 1 FROM runs q WHERE q.status = 'queued' AND NOT q.paused) AS waiting)` : none}
  SELECT f.ord, f.id, f.previous_status, f.event_seq, f.agent_id, f.conversation_id, f.connector, f.external_id,
    f.cancel_requested_by_actor_id, f.superseded_by_run_id, f.trigger_count, f.paused, f.policy, f.side_usage,
    ${any ? fragment<FencedBatchParams>`h.wakes_worker OR (h.frees_slot AND (SELECT waiting FROM queued)) AS woken,
    (SELECT count(*)::int FROM inserted i WHERE i.run_id = f.id) AS emitted` : raw("false AS woken, 0 AS emitted")}
  FROM fence f JOIN held h ON h.ord = f.ord
  ORDER BY f.ord`;
}

export const fencedBatchCommit = fencedBatchStatement("step_commit_fenced_batch", "any");
/** For a batch of held commits only (FencedCommitShape). */
export const fencedHeldBatchCommit = fencedBatchStatement("step_commit_held_batch", "held");

/** The statement for a batch: the held one when every commit in it is held. */
export function fencedBatchCommitFor(batch: readonly FencedCommitParams[]): typeof fencedBatchCommit {
  return batch.every((params) => shapeOf(params) === "held") ? fencedHeldBatchCommit : fencedBatchCommit;
}
