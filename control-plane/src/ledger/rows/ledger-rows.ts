// Ledger rows as the read side selects them: one interface per table (snake_case, as pg returns
// them: timestamptz as Date, int8 as string, jsonb parsed) and the column list that selects it.
// A column list is built from a record with exactly the interface's keys, so the two cannot drift.
import type { ToolEffect } from "../../domain/agent.js";
import type {
  AckState,
  ArtifactProvenance,
  DeliveryStatus,
  EmissionKind,
  ToolInvocationStatus,
} from "../../domain/records.js";
import type { StoredModelRequest } from "../../domain/model-request.js";
import type {
  BudgetDimension,
  CommitBoundary,
  ExecutionShape,
  ModelRole,
  Replayability,
  RunEventKind,
  RunStatus,
  RunUsage,
  WaitReason,
} from "../../domain/run.js";

type ColumnSet<R> = { readonly [K in keyof R]-?: true };

/**
 * `alias.a, alias.b, …` for every column of a row type, in the order listed; `instead` puts an
 * expression in a column's place (`NULL AS b`), for a read that leaves that column unread.
 */
function columns<R>(names: ColumnSet<R>): (alias: string, instead?: Partial<Record<keyof R & string, string>>) => string {
  const list = Object.keys(names) as (keyof R & string)[];
  return (alias, instead = {}) => list.map((name) => (instead[name] === undefined ? `${alias}.${name}` : `${instead[name]} AS ${name}`)).join(", ");
}

/** The columns of `runs` a RunRecord shows (its wait reason and queue position are worked out when read). */
export interface RunColumns {
  id: string;
  agent_id: string;
  conversation_id: string;
  connector: string;
  status: RunStatus;
  shape: ExecutionShape;
  commit_boundary: CommitBoundary;
  parent_run_id: string | null;
  root_run_id: string | null;
  superseded_by_run_id: string | null;
  continuation_of_run_id: string | null;
  logical_request_id: string | null;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  usage: Partial<RunUsage>;
  final_reply: string | null;
  error: string | null;
  exhausted_dimension: BudgetDimension | null;
  step_count: number;
  lease_epoch: string;
  paused: boolean;
  cancel_requested_by_actor_id: string | null;
  created_at: Date;
  updated_at: Date;
  finished_at: Date | null;
}

export const RUN_COLUMNS = columns<RunColumns>({
  id: true, agent_id: true, conversation_id: true, connector: true, status: true, shape: true, commit_boundary: true,
  parent_run_id: true, root_run_id: true, superseded_by_run_id: true, continuation_of_run_id: true, logical_request_id: true,
  requested_by_actor_id: true, reply_to_message_id: true, usage: true, final_reply: true, error: true, exhausted_dimension: true,
  step_count: true, lease_epoch: true, paused: true, cancel_requested_by_actor_id: true, created_at: true, updated_at: true,
  finished_at: true,
});

/** A run as the operator view selects it (run-query.repository.ts): its columns and what is worked out when it is read. */
export interface RunRow extends RunColumns {
  external_conversation_id: string;
  /** For a queued run, why it has not started as of the read; the stored reason otherwise. */
  effective_wait_reason: WaitReason | null;
  queue_position: number;
  forked_from_run_id: string | null;
  forked_at_step: number | null;
  fork_reason: string | null;
  fork_run_ids: string[];
}

export interface RunTriggerRow {
  run_id: string;
  external_message_id: string;
  actor_id: string;
  received_at: Date;
}

export const RUN_TRIGGER_COLUMNS = columns<RunTriggerRow>({ run_id: true, external_message_id: true, actor_id: true, received_at: true });

export interface RunStepRow {
  id: string;
  run_id: string;
  index: number;
  replayability: Replayability;
  run_status_after: RunStatus;
  actor_id: string | null;
  lease_epoch: string;
  started_at: Date;
  committed_at: Date;
}

export const RUN_STEP_COLUMNS = columns<RunStepRow>({
  id: true, run_id: true, index: true, replayability: true, run_status_after: true, actor_id: true, lease_epoch: true,
  started_at: true, committed_at: true,
});

export interface ModelCallRow {
  id: string;
  run_id: string;
  step_id: string;
  role: ModelRole;
  provider: string;
  model: string;
  request: StoredModelRequest;
  response_text: string;
  tool_calls: unknown;
  input_tokens: number;
  output_tokens: number;
  latency_ms: number;
  finish_reason: string;
  cost_micro_usd: string;
}

export const MODEL_CALL_COLUMNS = columns<ModelCallRow>({
  id: true, run_id: true, step_id: true, role: true, provider: true, model: true, request: true, response_text: true,
  tool_calls: true, input_tokens: true, output_tokens: true, latency_ms: true, finish_reason: true, cost_micro_usd: true,
});

export interface ToolInvocationRow {
  id: string;
  run_id: string;
  step_id: string | null;
  model_call_id: string | null;
  ordinal: number;
  tool_name: string;
  tool_version: string;
  effect: ToolEffect;
  arguments: unknown;
  status: ToolInvocationStatus;
  refusal_reason: string | null;
  result_text: string | null;
  exit_code: number | null;
  duration_ms: number | null;
  output_truncated: boolean;
  resolved_outcome: "applied" | "not_applied" | null;
  resolved_by_actor_id: string | null;
  resolution_reason: string | null;
  created_at: Date;
  finished_at: Date | null;
}

export const TOOL_INVOCATION_COLUMNS = columns<ToolInvocationRow>({
  id: true, run_id: true, step_id: true, model_call_id: true, ordinal: true, tool_name: true, tool_version: true, effect: true,
  arguments: true, status: true, refusal_reason: true, result_text: true, exit_code: true, duration_ms: true,
  output_truncated: true, resolved_outcome: true, resolved_by_actor_id: true, resolution_reason: true, created_at: true,
  finished_at: true,
});

export interface ObservationRow {
  id: string;
  tool_invocation_id: string;
  seq: number;
  stream: string;
  text: string;
  truncated: boolean;
  observed_at: Date;
}

export const OBSERVATION_COLUMNS = columns<ObservationRow>({
  id: true, tool_invocation_id: true, seq: true, stream: true, text: true, truncated: true, observed_at: true,
});

export interface ArtifactRow {
  id: string;
  run_id: string;
  tool_invocation_id: string | null;
  type: string;
  schema_version: string;
  provenance: ArtifactProvenance;
  inline_data: string | null;
  reference: string | null;
  subject_artifact_id: string | null;
  conclusion: "passed" | "failed" | null;
  created_at: Date;
}

export const ARTIFACT_COLUMNS = columns<ArtifactRow>({
  id: true, run_id: true, tool_invocation_id: true, type: true, schema_version: true, provenance: true, inline_data: true,
  reference: true, subject_artifact_id: true, conclusion: true, created_at: true,
});

export interface RunEventRow {
  run_id: string;
  seq: number;
  kind: RunEventKind;
  status: RunStatus | null;
  step_id: string | null;
  tool_invocation_id: string | null;
  summary: string;
  at: Date;
}

export const RUN_EVENT_COLUMNS = columns<RunEventRow>({
  run_id: true, seq: true, kind: true, status: true, step_id: true, tool_invocation_id: true, summary: true, at: true,
});

export interface EmissionRow {
  id: string;
  seq: string;
  connector: string;
  kind: EmissionKind;
  run_id: string | null;
  agent_id: string;
  external_conversation_id: string;
  reply_to_message_id: string | null;
  text: string;
  ack_state: AckState | null;
  idempotency_key: string;
  addressed_actor_ids: string[];
  delivery_status: DeliveryStatus;
  remote_ref: string | null;
  created_at: Date;
}

export const EMISSION_COLUMNS = columns<EmissionRow>({
  id: true, seq: true, connector: true, kind: true, run_id: true, agent_id: true, external_conversation_id: true,
  reply_to_message_id: true, text: true, ack_state: true, idempotency_key: true, addressed_actor_ids: true,
  delivery_status: true, remote_ref: true, created_at: true,
});
