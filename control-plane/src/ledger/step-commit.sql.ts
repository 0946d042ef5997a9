// The fenced commit as registered statements. Every part a shape has is always there: what a
// commit does not carry is an empty JSON array or a false guard, so one prepared plan per shape
// serves every commit of that shape.
import type { Policy } from "../domain/agent.js";
import type { RunStatus } from "../domain/run.js";
import type { ReplyGuard } from "../domain/settlement.js";
import type { Fence, StepCommit, ToolOutcome } from "../runner/run-store.js";
import { emissionInsert, type EmissionRowsParams, type RunEventDraft } from "./ledger-writes.js";
import { fragment, raw, statement } from "./sql.js";
import { durabilityCte } from "./server-durability.js";

/** What one fenced commit writes besides the run row (a step's model call is on the step's row). */
export interface FencedChange {
  readonly step: StepCommit["step"];
  /** Results settled by this commit, in the order they finished. */
  readonly outcomes: readonly ToolOutcome[];
  readonly crossesCommitBoundary: boolean;
  /** A write intent or outcome: the commit must be durable before anything else happens. */
  readonly writes: boolean;
  /**
   * Events stored as rows of their own. The step's event and each settled call's event are not
   * here: they are read from the step row and the call row (run_event_feed), numbered with these
   * in the commit's order (step-commit-params.ts).
   */
  readonly events: readonly RunEventDraft[];
  /** The step's event's summary, when the commit records a step. */
  readonly stepSummary?: string | undefined;
  /** Write nothing if a stop is requested or the trigger count moved from the one given; see StepCommit.unlessChangedSince. */
  readonly unlessChangedSince: ReplyGuard | undefined;
  /** The step's model request as stored, its tool list by reference (tool-sets.ts); else the request as it is. */
  readonly requestJson?: string | undefined;
  /** This process's last commit of the run left the status this one sets (the run may have changed since). */
  readonly statusKept?: boolean;
}

/** What a fenced commit and readControl read back of a run's control state. */
export interface ControlRow {
  cancel_requested_by_actor_id: string | null;
  superseded_by_run_id: string | null;
  paused: boolean;
  trigger_count: number;
  policy: Policy;
  /** The calls beside the loop, as model-call.repository.ts accumulates them. */
  side_usage: Record<string, unknown>;
}

export interface FenceRow extends ControlRow {
  id: string;
  /** Emissions this commit reserved (its connector's streams are woken after it). */
  emitted: number;
  /** Whether a worker should look for a run now (woken after the commit). */
  woken: boolean;
  previous_status: RunStatus;
  event_seq: number;
  agent_id: string;
  conversation_id: string;
  connector: string;
  external_id: string;
}

type Nullable<T> = { readonly [K in keyof T]: T[K] | null };

interface StepParams {
  readonly stepId: string;
  readonly stepIndex: number;
  readonly replayability: string;
  readonly actorId: string;
  readonly feedback: string;
  readonly startedAt: Date;
}

interface CallParams {
  readonly callId: string;
  readonly role: string;
  readonly provider: string;
  readonly model: string;
  readonly request: string;
  readonly responseText: string;
  readonly toolCalls: string;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly latencyMs: number;
  readonly finishReason: string;
  readonly costMicroUsd: number;
}

export interface FencedCommitParams extends Fence, Nullable<StepParams>, Nullable<CallParams>, EmissionRowsParams {
  readonly synchronousCommit: "on" | "off";
  readonly status: RunStatus;
  readonly usage: string;
  readonly finalReply: string | null;
  readonly error: string | null;
  readonly exhaustedDimension: string | null;
  readonly waitReason: string | null;
  readonly crossesCommitBoundary: boolean;
  readonly terminal: boolean;
  readonly keepsLease: boolean;
  readonly guarded: boolean;
  readonly guardTriggerCount: number | null;
  readonly hasStep: boolean;
  /** JSON arrays: the step's intents, the results settled, their artifacts, the events. */
  readonly intents: string;
  readonly outcomes: string;
  /** The settled calls' ids again, as an array: the update finds them by primary key, not by scanning the run's calls. */
  readonly outcomeIds: readonly string[];
  readonly artifacts: string;
  readonly events: string;
  /** Every event the commit numbers, those read from its rows included; the status change is not counted. */
  readonly eventCount: number;
  /** The step's event's summary; the step's event is the last the commit counts. */
  readonly stepEventSummary: string | null;
  readonly wakesWorker: boolean;
  readonly freesSlot: boolean;
  /**
   * The commit expects to store no event row: it carries none of its own, and its status is the
   * one the run's last commit left, so its status event will not fire. Its statement then has no
   * events insert, and matches nothing if the status did change after all (fencedQuietCommit).
   */
  readonly storesNoEvent: boolean;
}

/**
 * The JSON records a fenced commit reads its parts from, and how a call is settled: shared by the
 * commit of one run (below) and a batch's (step-commit-batch.sql.ts), which must write alike.
 */
export const INTENT_RECORD = "x(id uuid, provider_call_id text, ordinal int, tool_name text, tool_version text, effect text, arguments jsonb, status text, refusal_reason text)";
export const OUTCOME_RECORD = "x(id uuid, outcome text, result_text text, refusal_reason text, exit_code int, duration_ms int, truncated boolean, answered_by text, resolved_outcome text, event_ord int)";
export const ARTIFACT_RECORD = "x(id uuid, tool_invocation_id uuid, type text, schema_version text, provenance text, inline_data text, reference text, subject_artifact_id uuid, conclusion text)";
export const EVENT_RECORD = "e(ord int, kind text, status text, step_id uuid, tool_invocation_id uuid, summary text, only_on_change boolean)";
/** The inserts both fenced statements make, each SELECT giving the columns in this order. */
export const STEP_INSERT = `INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, actor_id, feedback, lease_epoch, started_at,
      event_seq, event_summary, call_id, call_role, call_provider, call_model, call_request, call_response_text, call_tool_calls,
      call_input_tokens, call_output_tokens, call_latency_ms, call_finish_reason, call_cost_micro_usd)`;
export const INTENT_INSERT = `INSERT INTO tool_invocations (id, run_id, step_id, model_call_id, provider_call_id, ordinal, tool_name, tool_version,
      effect, arguments, status, refusal_reason, finished_at)`;
export const ARTIFACT_INSERT = `INSERT INTO artifacts (id, run_id, tool_invocation_id, type, schema_version, provenance, inline_data, reference,
      subject_artifact_id, conclusion)`;
export const EVENT_INSERT = `INSERT INTO run_events (run_id, seq, kind, status, step_id, tool_invocation_id, summary)`;
/** The SET list of a settled call `t` from its outcome record `x` (its event's number is set beside it). */
export const SETTLE_CALL = "status = x.outcome, result_text = x.result_text, refusal_reason = coalesce(x.refusal_reason, t.refusal_reason), exit_code = x.exit_code, duration_ms = x.duration_ms, output_truncated = x.truncated, finished_at = now(), resolved_by_actor_id = coalesce(x.answered_by, t.resolved_by_actor_id), resolved_outcome = coalesce(x.resolved_outcome, t.resolved_outcome)";

const p = <K extends keyof FencedCommitParams>(key: K) => (params: FencedCommitParams) => params[key];
const status = p("status");
const keepsLease = p("keepsLease");
const guardTriggerCount = p("guardTriggerCount");
const epoch = p("epoch");
const stepId = p("stepId");
const callId = p("callId");
const eventCount = p("eventCount");

/**
 * A commit's shape, which picks its statement. "held": the run keeps its lease and the commit
 * writes no artifact and no emission, as every iteration of a loop but its last does; its
 * statement leaves those parts out, so PostgreSQL neither sets them up nor runs them on the
 * hottest path (about a tenth of the commit's time). "any": every part, for any commit.
 */
export type FencedCommitShape = "held" | "any";

/**
 * One fenced commit: it locks the run row, checks the lease owner and epoch, writes the run's
 * new status, and inserts the step, intents, results, artifacts, events and emissions only FROM
 * the fence's row, so a worker that lost its lease matches nothing and writes nothing.
 */
function fencedCommitStatement(name: string, shape: FencedCommitShape, quiet = false) {
  const any = shape === "any";
  const none = fragment<FencedCommitParams>``;
  // The number of the commit's first event. Numbered by arithmetic, not a window: the status
  // event is the last and present only on a change, so each event's number follows from its
  // ordinal (a window's sort cost about a tenth).
  const firstSeq = fragment<FencedCommitParams>`(fence.event_seq - ${eventCount}::int - CASE WHEN fence.previous_status <> ${status}::text THEN 1 ELSE 0 END + 1)`;
  return statement<FencedCommitParams, FenceRow>(name)`
  WITH ${durabilityCte<FencedCommitParams>(p("synchronousCommit"))},
  previous AS (SELECT id, status FROM runs WHERE id = ${p("runId")}::uuid FOR NO KEY UPDATE),
  fence AS (
    UPDATE runs r SET status = ${status}::text, usage = ${p("usage")}::jsonb, step_count = r.step_count + CASE WHEN ${p("hasStep")}::boolean THEN 1 ELSE 0 END,
      final_reply = coalesce(${p("finalReply")}::text, r.final_reply), error = coalesce(${p("error")}::text, r.error),
      exhausted_dimension = coalesce(${p("exhaustedDimension")}::text, r.exhausted_dimension), wait_reason = ${p("waitReason")}::text,
      commit_boundary = CASE WHEN ${p("crossesCommitBoundary")}::boolean THEN 'committed' ELSE r.commit_boundary END,
      updated_at = now(), finished_at = CASE WHEN ${p("terminal")}::boolean THEN now() ELSE r.finished_at END,
      lease_owner = CASE WHEN ${keepsLease}::boolean THEN r.lease_owner ELSE NULL END,
      lease_expires_at = CASE WHEN ${keepsLease}::boolean THEN r.lease_expires_at ELSE NULL END,
      event_seq = r.event_seq + ${eventCount}::int + CASE WHEN previous.status <> ${status}::text THEN 1 ELSE 0 END
    FROM previous, durability, ${any ? raw("conversations c, ") : raw("")}agents a
    WHERE r.id = ${p("runId")}::uuid AND r.id = previous.id AND ${any ? raw("c.id = r.conversation_id AND ") : raw("")}a.id = r.agent_id
      AND r.lease_epoch = ${epoch}::bigint AND r.lease_owner = ${p("workerId")}::text
      AND (NOT ${p("guarded")}::boolean OR (r.cancel_requested_by_actor_id IS NULL AND (${guardTriggerCount}::int IS NULL OR r.trigger_count = ${guardTriggerCount}::int)))${
        quiet ? fragment<FencedCommitParams>`
      AND previous.status = ${status}::text` : none}
    RETURNING r.id, previous.status AS previous_status, r.event_seq, r.agent_id, r.conversation_id, r.connector,
      ${any ? raw("c.external_id") : raw("NULL::text AS external_id")}, r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.trigger_count, r.paused,
      a.policy, r.side_usage),
  new_step AS (
    ${raw(STEP_INSERT)}
    SELECT ${stepId}::uuid, fence.id, ${p("stepIndex")}::int, ${p("replayability")}::text, ${status}::text, ${p("actorId")}::text,
      ${p("feedback")}::text, ${epoch}::bigint, ${p("startedAt")}::timestamptz, ${firstSeq} + ${eventCount}::int - 1, ${p("stepEventSummary")}::text,
      ${callId}::uuid, ${p("role")}::text, ${p("provider")}::text, ${p("model")}::text, ${p("request")}::jsonb, ${p("responseText")}::text,
      ${p("toolCalls")}::jsonb, ${p("inputTokens")}::int, ${p("outputTokens")}::int, ${p("latencyMs")}::int, ${p("finishReason")}::text,
      ${p("costMicroUsd")}::bigint
    FROM fence WHERE ${p("hasStep")}::boolean),
  new_intents AS (
    ${raw(INTENT_INSERT)}
    SELECT x.id, fence.id, ${stepId}::uuid, ${callId}::uuid, x.provider_call_id, x.ordinal, x.tool_name, x.tool_version, x.effect, x.arguments,
      x.status, x.refusal_reason, CASE WHEN x.status = 'refused' THEN now() END
    FROM fence, jsonb_to_recordset(${p("intents")}::jsonb) AS ${raw(INTENT_RECORD)}),
  -- The settled calls are found by key. The run test is kept off the run_id index on purpose
  -- (IS TRUE): a generic plan that found them through it read every call of the run on each
  -- commit, so a long run's commits grew slower with every step.
  settled AS (
    UPDATE tool_invocations t SET ${raw(SETTLE_CALL)}, settled_seq = ${firstSeq} + x.event_ord
    FROM fence, jsonb_to_recordset(${p("outcomes")}::jsonb) AS ${raw(OUTCOME_RECORD)}
    WHERE t.id = ANY(${p("outcomeIds")}::uuid[]) AND t.id = x.id AND (t.run_id = fence.id) IS TRUE)${any ? fragment<FencedCommitParams>`,
  new_artifacts AS (
    ${raw(ARTIFACT_INSERT)}
    SELECT x.id, fence.id, x.tool_invocation_id, x.type, x.schema_version, x.provenance, x.inline_data, x.reference,
      x.subject_artifact_id, x.conclusion
    FROM fence, jsonb_to_recordset(${p("artifacts")}::jsonb) AS ${raw(ARTIFACT_RECORD)})` : none}${quiet ? none : fragment<FencedCommitParams>`,
  new_events AS (
    ${raw(EVENT_INSERT)}
    SELECT fence.id, ${firstSeq} + e.ord, e.kind, e.status, e.step_id,
      e.tool_invocation_id, e.summary
    FROM fence, jsonb_to_recordset(${p("events")}::jsonb) AS ${raw(EVENT_RECORD)}
    WHERE NOT e.only_on_change OR fence.previous_status <> ${status}::text)`}${any ? fragment<FencedCommitParams>`,
  target AS (SELECT id, agent_id, conversation_id, external_id AS external_conversation_id, connector FROM fence),
  ${emissionInsert}` : none}
  SELECT fence.*,
    ${any ? fragment<FencedCommitParams>`${p("wakesWorker")}::boolean OR (${p("freesSlot")}::boolean AND EXISTS (SELECT 1 FROM runs q WHERE q.status = 'queued' AND NOT q.paused)) AS woken,
    (SELECT count(*)::int FROM inserted) AS emitted` : raw("false AS woken, 0 AS emitted")}
  FROM fence`;
}

export const fencedCommit = fencedCommitStatement("step_commit_fenced", "any");
export const fencedHeldCommit = fencedCommitStatement("step_commit_held", "held");
/**
 * A held commit that stores no event row, as every iteration of a steady loop is: without the
 * events insert PostgreSQL neither sets it up nor runs it (about a sixteenth of the round trip).
 * The fence also requires the status to be unchanged, so if it changed after all the commit
 * writes nothing and the caller commits again with fencedHeldCommit, which records the change.
 */
export const fencedQuietCommit = fencedCommitStatement("step_commit_quiet", "held", true);

/** A commit's shape (FencedCommitShape): "held" when it keeps its lease and writes no artifact and no emission. */
export function shapeOf(params: FencedCommitParams): FencedCommitShape {
  return params.keepsLease && params.artifacts === "[]" && params.emissions === "[]" ? "held" : "any";
}

/** The statement for a commit's shape, the quiet one for a held commit that stores no event row. */
export function fencedCommitFor(params: FencedCommitParams): typeof fencedCommit {
  if (shapeOf(params) === "any") return fencedCommit;
  return params.storesNoEvent ? fencedQuietCommit : fencedHeldCommit;
}

const CONTROL_COLUMNS = "r.cancel_requested_by_actor_id, r.superseded_by_run_id, r.paused, r.trigger_count, a.policy, r.side_usage";

export const controlOfRun = statement<{ runId: string }, ControlRow>("run_control")`
  SELECT ${raw(CONTROL_COLUMNS)} FROM runs r JOIN agents a ON a.id = r.agent_id WHERE r.id = ${(q) => q.runId}::uuid`;

/** The control state of a run the fence still holds; nothing when the lease is gone. */
export const controlOfHeldRun = statement<Fence, ControlRow>("run_control_held")`
  SELECT ${raw(CONTROL_COLUMNS)} FROM runs r JOIN agents a ON a.id = r.agent_id
  WHERE r.id = ${(q) => q.runId}::uuid AND r.lease_epoch = ${(q) => q.epoch}::bigint AND r.lease_owner = ${(q) => q.workerId}::text`;
