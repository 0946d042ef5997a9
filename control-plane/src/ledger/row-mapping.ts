// Ledger rows (ledger/rows/ledger-rows.ts) to domain records.
import type {
  ArtifactRecord,
  EmissionRecord,
  ModelCallRecord,
  ObservationRecord,
  RunEventRecord,
  RunRecord,
  ToolInvocationRecord,
  TriggerRecord,
} from "../domain/records.js";
import { ZERO_USAGE } from "../domain/run.js";
import type {
  ArtifactRow,
  EmissionRow,
  ModelCallRow,
  ObservationRow,
  RunEventRow,
  RunRow,
  RunTriggerRow,
  ToolInvocationRow,
} from "./rows/ledger-rows.js";
import { optional, optionalDate } from "./sql.js";

export function toRunRecord(row: RunRow, triggers: readonly TriggerRecord[]): RunRecord {
  return {
    id: row.id,
    agentId: row.agent_id,
    conversationId: row.conversation_id,
    externalConversationId: row.external_conversation_id,
    connector: row.connector,
    status: row.status,
    waitReason: optional(row.effective_wait_reason),
    queuePosition: Number(row.queue_position),
    logicalRequestId: row.logical_request_id ?? row.id,
    shape: row.shape,
    commitBoundary: row.commit_boundary,
    parentRunId: optional(row.parent_run_id),
    rootRunId: optional(row.root_run_id),
    supersededByRunId: optional(row.superseded_by_run_id),
    continuationOfRunId: optional(row.continuation_of_run_id),
    requestedByActorId: row.requested_by_actor_id,
    replyToMessageId: optional(row.reply_to_message_id),
    triggers,
    usage: { ...ZERO_USAGE, ...row.usage },
    finalReply: optional(row.final_reply),
    error: optional(row.error),
    exhaustedDimension: optional(row.exhausted_dimension),
    stepCount: Number(row.step_count),
    leaseEpoch: Number(row.lease_epoch),
    paused: row.paused,
    cancelledByActorId: optional(row.cancel_requested_by_actor_id),
    fork:
      row.forked_from_run_id === null
        ? undefined
        : { fromRunId: row.forked_from_run_id, atStep: Number(row.forked_at_step ?? 0), reason: row.fork_reason ?? "" },
    forkRunIds: row.fork_run_ids,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    finishedAt: optionalDate(row.finished_at),
  };
}

export function toTriggerRecord(row: RunTriggerRow): TriggerRecord {
  return { messageId: row.external_message_id, actorId: row.actor_id, receivedAt: row.received_at };
}

export function toModelCallRecord(row: ModelCallRow): ModelCallRecord {
  return {
    id: row.id,
    role: row.role,
    provider: row.provider,
    model: row.model,
    requestJson: JSON.stringify(row.request),
    responseText: row.response_text,
    toolCallsJson: JSON.stringify(row.tool_calls),
    inputTokens: Number(row.input_tokens),
    outputTokens: Number(row.output_tokens),
    latencyMs: Number(row.latency_ms),
    finishReason: row.finish_reason,
    costMicroUsd: Number(row.cost_micro_usd),
  };
}

export function toObservationRecord(row: ObservationRow): ObservationRecord {
  return {
    id: row.id,
    seq: Number(row.seq),
    stream: row.stream,
    text: row.text,
    truncated: row.truncated,
    observedAt: row.observed_at,
  };
}

export function toToolInvocationRecord(row: ToolInvocationRow, observations: readonly ObservationRecord[]): ToolInvocationRecord {
  return {
    id: row.id,
    runId: row.run_id,
    stepId: optional(row.step_id),
    modelCallId: optional(row.model_call_id),
    ordinal: Number(row.ordinal),
    toolName: row.tool_name,
    toolVersion: row.tool_version,
    effect: row.effect,
    argumentsJson: JSON.stringify(row.arguments),
    status: row.status,
    refusalReason: optional(row.refusal_reason),
    resultText: optional(row.result_text),
    observations,
    exitCode: row.exit_code === null ? undefined : Number(row.exit_code),
    durationMs: row.duration_ms === null ? undefined : Number(row.duration_ms),
    outputTruncated: row.output_truncated,
    resolvedOutcome: optional(row.resolved_outcome),
    resolvedByActorId: optional(row.resolved_by_actor_id),
    resolutionReason: optional(row.resolution_reason),
    createdAt: row.created_at,
    finishedAt: optionalDate(row.finished_at),
  };
}

export function toArtifactRecord(row: ArtifactRow): ArtifactRecord {
  return {
    id: row.id,
    runId: row.run_id,
    toolInvocationId: optional(row.tool_invocation_id),
    type: row.type,
    schemaVersion: row.schema_version,
    provenance: row.provenance,
    inlineData: optional(row.inline_data),
    reference: optional(row.reference),
    subjectArtifactId: optional(row.subject_artifact_id),
    conclusion: optional(row.conclusion),
    createdAt: row.created_at,
  };
}

export function toRunEventRecord(row: RunEventRow): RunEventRecord {
  return {
    runId: row.run_id,
    seq: Number(row.seq),
    kind: row.kind,
    status: optional(row.status),
    stepId: optional(row.step_id),
    toolInvocationId: optional(row.tool_invocation_id),
    summary: row.summary,
    at: row.at,
  };
}

export function toEmissionRecord(row: EmissionRow): EmissionRecord {
  return {
    id: row.id,
    seq: Number(row.seq),
    connector: row.connector,
    kind: row.kind,
    runId: optional(row.run_id),
    agentId: row.agent_id,
    externalConversationId: row.external_conversation_id,
    replyToMessageId: optional(row.reply_to_message_id),
    text: row.text,
    ackState: optional(row.ack_state),
    idempotencyKey: row.idempotency_key,
    addressedActorIds: row.addressed_actor_ids,
    deliveryStatus: row.delivery_status,
    remoteRef: optional(row.remote_ref),
    createdAt: row.created_at,
  };
}
