// Between proto messages and domain records. No business logic here.
import { create, toBinary, type DescEnum } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import {
  AckStateSchema,
  DeliveryStatusSchema,
  EmissionKindSchema,
  EmissionSchema,
  SubscribeResponseSchema,
  type Emission,
  type SubscribeResponse,
} from "../../../gen/keel/v1/emission_service_pb.js";
import {
  ArtifactProvenanceSchema,
  ArtifactSchema,
  BudgetDimensionSchema,
  CommitBoundarySchema,
  ExecutionShapeSchema,
  ModelRoleSchema,
  ReplayabilitySchema,
  ResolvedOutcomeSchema,
  RunEventKindSchema,
  RunEventSchema,
  RunSchema,
  RunStatusSchema,
  RunStepSchema,
  ToolEffectSchema,
  ToolInvocationSchema,
  ToolInvocationStatusSchema,
  VerificationConclusionSchema,
  WaitReasonSchema,
  type Artifact,
  type Run,
  type RunEvent,
  type RunStep,
  type ToolInvocation,
} from "../../../gen/keel/v1/run_pb.js";
import type {
  ArtifactRecord,
  EmissionRecord,
  RunEventRecord,
  RunRecord,
  RunStepRecord,
  ToolInvocationRecord,
} from "../domain/records.js";

/** Domain values are the proto enum's local names, lowercased ("awaiting_tool"). */
export function toEnum(schema: DescEnum, value: string | undefined): number {
  if (value === undefined) return 0;
  return schema.values.find((v) => v.localName === value.toUpperCase())?.number ?? 0;
}

export function fromEnum<T extends string>(schema: DescEnum, value: number): T | undefined {
  if (value === 0) return undefined;
  return schema.value[value]?.localName.toLowerCase() as T | undefined;
}

const ts = (date: Date | undefined) => (date === undefined ? undefined : timestampFromDate(date));

export function runToProto(run: RunRecord): Run {
  return create(RunSchema, {
    id: run.id,
    agentId: run.agentId,
    conversationId: run.externalConversationId,
    status: toEnum(RunStatusSchema, run.status),
    waitReason: toEnum(WaitReasonSchema, run.waitReason),
    shape: toEnum(ExecutionShapeSchema, run.shape),
    commitBoundary: toEnum(CommitBoundarySchema, run.commitBoundary),
    parentRunId: run.parentRunId ?? "",
    rootRunId: run.rootRunId ?? "",
    supersededByRunId: run.supersededByRunId ?? "",
    triggers: run.triggers.map((t) => ({ messageId: t.messageId, actorId: t.actorId, receivedAt: ts(t.receivedAt) })),
    requestedBy: { id: run.requestedByActorId },
    usage: {
      iterations: run.usage.iterations,
      modelCalls: run.usage.modelCalls,
      toolCalls: run.usage.toolCalls,
      inputTokens: BigInt(run.usage.inputTokens),
      outputTokens: BigInt(run.usage.outputTokens),
      outputBytes: BigInt(run.usage.outputBytes),
      costMicroUsd: BigInt(run.usage.costMicroUsd),
      wallClockMs: BigInt(run.usage.wallClockMs),
    },
    finalReply: run.finalReply ?? "",
    error: run.error ?? "",
    exhaustedDimension: toEnum(BudgetDimensionSchema, run.exhaustedDimension),
    stepCount: run.stepCount,
    leaseEpoch: BigInt(run.leaseEpoch),
    paused: run.paused,
    cancelledByActorId: run.cancelledByActorId ?? "",
    continuationOfRunId: run.continuationOfRunId ?? "",
    queuePosition: run.queuePosition,
    connector: run.connector,
    forkedFromRunId: run.fork?.fromRunId ?? "",
    forkedAtStep: run.fork?.atStep ?? 0,
    forkReason: run.fork?.reason ?? "",
    forkRunIds: [...run.forkRunIds],
    createdAt: ts(run.createdAt),
    updatedAt: ts(run.updatedAt),
    finishedAt: ts(run.finishedAt),
  });
}

export function toolInvocationToProto(invocation: ToolInvocationRecord): ToolInvocation {
  return create(ToolInvocationSchema, {
    id: invocation.id,
    runId: invocation.runId,
    stepId: invocation.stepId ?? "",
    ordinal: invocation.ordinal,
    toolName: invocation.toolName,
    toolVersion: invocation.toolVersion,
    effect: toEnum(ToolEffectSchema, invocation.effect),
    argumentsJson: invocation.argumentsJson,
    status: toEnum(ToolInvocationStatusSchema, invocation.status),
    refusalReason: invocation.refusalReason ?? "",
    resultText: invocation.resultText ?? "",
    observations: invocation.observations.map((o) => ({
      id: o.id,
      seq: o.seq,
      stream: o.stream,
      text: o.text,
      truncated: o.truncated,
      observedAt: ts(o.observedAt),
    })),
    exitCode: invocation.exitCode ?? 0,
    durationMs: invocation.durationMs ?? 0,
    outputTruncated: invocation.outputTruncated,
    resolvedOutcome: toEnum(ResolvedOutcomeSchema, invocation.resolvedOutcome),
    resolvedByActorId: invocation.resolvedByActorId ?? "",
    resolutionReason: invocation.resolutionReason ?? "",
    modelCallId: invocation.modelCallId ?? "",
    createdAt: ts(invocation.createdAt),
    finishedAt: ts(invocation.finishedAt),
  });
}

export function runStepToProto(step: RunStepRecord): RunStep {
  const call = step.modelCall;
  return create(RunStepSchema, {
    id: step.id,
    runId: step.runId,
    index: step.index,
    replayability: toEnum(ReplayabilitySchema, step.replayability),
    modelCall:
      call === undefined
        ? undefined
        : {
            id: call.id,
            role: toEnum(ModelRoleSchema, call.role),
            provider: call.provider,
            model: call.model,
            requestJson: call.requestJson,
            responseText: call.responseText,
            toolCallsJson: call.toolCallsJson,
            usage: { inputTokens: BigInt(call.inputTokens), outputTokens: BigInt(call.outputTokens) },
            latencyMs: call.latencyMs,
            finishReason: call.finishReason,
            costMicroUsd: BigInt(call.costMicroUsd),
          },
    toolInvocations: step.toolInvocations.map(toolInvocationToProto),
    runStatusAfter: toEnum(RunStatusSchema, step.runStatusAfter),
    actorId: step.actorId ?? "",
    leaseEpoch: BigInt(step.leaseEpoch),
    startedAt: ts(step.startedAt),
    committedAt: ts(step.committedAt),
  });
}

export function artifactToProto(artifact: ArtifactRecord): Artifact {
  return create(ArtifactSchema, {
    id: artifact.id,
    runId: artifact.runId,
    toolInvocationId: artifact.toolInvocationId ?? "",
    type: artifact.type,
    schemaVersion: artifact.schemaVersion,
    provenance: toEnum(ArtifactProvenanceSchema, artifact.provenance),
    inlineData: artifact.inlineData ?? "",
    reference: artifact.reference ?? "",
    subjectArtifactId: artifact.subjectArtifactId ?? "",
    conclusion: toEnum(VerificationConclusionSchema, artifact.conclusion),
    createdAt: ts(artifact.createdAt),
  });
}

export function runEventToProto(event: RunEventRecord): RunEvent {
  return create(RunEventSchema, {
    runId: event.runId,
    seq: BigInt(event.seq),
    kind: toEnum(RunEventKindSchema, event.kind),
    status: toEnum(RunStatusSchema, event.status),
    stepId: event.stepId ?? "",
    toolInvocationId: event.toolInvocationId ?? "",
    summary: event.summary,
    at: ts(event.at),
  });
}

export function emissionToProto(emission: EmissionRecord): Emission {
  return create(EmissionSchema, {
    id: emission.id,
    seq: BigInt(emission.seq),
    connector: emission.connector,
    kind: toEnum(EmissionKindSchema, emission.kind),
    runId: emission.runId ?? "",
    agentId: emission.agentId,
    conversationId: emission.externalConversationId,
    replyToMessageId: emission.replyToMessageId ?? "",
    text: emission.text,
    ackState: toEnum(AckStateSchema, emission.ackState),
    idempotencyKey: emission.idempotencyKey,
    addressedActorIds: [...emission.addressedActorIds],
    deliveryStatus: toEnum(DeliveryStatusSchema, emission.deliveryStatus),
    remoteRef: emission.remoteRef ?? "",
    createdAt: ts(emission.createdAt),
  });
}

/**
 * A SubscribeResponse carrying its emission already encoded, so that the hundred streams of a
 * connector share one encoding instead of each encoding it again. The bytes ride as the message's
 * unknown field `emission`, which protobuf-es writes out verbatim: on the wire they are that field,
 * byte for byte. Binary codecs only: JSON drops unknown fields.
 */
export function encodedSubscribeResponse(emission: Emission): SubscribeResponse {
  const data = new BinaryWriter().bytes(toBinary(EmissionSchema, emission)).finish();
  const response = create(SubscribeResponseSchema);
  response.$unknown = [{ no: SubscribeResponseSchema.field.emission.number, wireType: WireType.LengthDelimited, data }];
  return response;
}
