// Read models of the ledger, as plain data. api/ converts them to proto messages.
import type { ToolEffect } from "./agent.js";
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
} from "./run.js";

export interface TriggerRecord {
  readonly messageId: string;
  readonly actorId: string;
  readonly receivedAt: Date;
}

export interface RunRecord {
  readonly id: string;
  readonly agentId: string;
  readonly conversationId: string;
  readonly externalConversationId: string;
  readonly connector: string;
  readonly status: RunStatus;
  readonly waitReason: WaitReason | undefined;
  readonly shape: ExecutionShape;
  readonly commitBoundary: CommitBoundary;
  readonly parentRunId: string | undefined;
  readonly rootRunId: string | undefined;
  readonly supersededByRunId: string | undefined;
  readonly continuationOfRunId: string | undefined;
  readonly requestedByActorId: string;
  readonly replyToMessageId: string | undefined;
  readonly triggers: readonly TriggerRecord[];
  /** For a queued run: its place in the queue it waits in (its conversation's, else its agent's), from 1; else 0. */
  readonly queuePosition: number;
  /** The request a supersession chain answers: the first run's id. */
  readonly logicalRequestId: string;
  readonly usage: RunUsage;
  readonly finalReply: string | undefined;
  readonly error: string | undefined;
  readonly exhaustedDimension: BudgetDimension | undefined;
  readonly stepCount: number;
  readonly leaseEpoch: number;
  readonly paused: boolean;
  readonly cancelledByActorId: string | undefined;
  /** An operator's fork: where it starts from, and why; and on any run, the forks taken from it. */
  readonly fork: { readonly fromRunId: string; readonly atStep: number; readonly reason: string } | undefined;
  readonly forkRunIds: readonly string[];
  readonly createdAt: Date;
  readonly updatedAt: Date;
  readonly finishedAt: Date | undefined;
}

export type ToolInvocationStatus = "pending" | "succeeded" | "failed" | "refused" | "interrupted" | "unknown_outcome";

export interface ObservationRecord {
  readonly id: string;
  readonly seq: number;
  readonly stream: string;
  readonly text: string;
  readonly truncated: boolean;
  readonly observedAt: Date;
}

export interface ToolInvocationRecord {
  readonly id: string;
  readonly runId: string;
  readonly stepId: string | undefined;
  readonly modelCallId: string | undefined;
  readonly ordinal: number;
  readonly toolName: string;
  readonly toolVersion: string;
  readonly effect: ToolEffect;
  readonly argumentsJson: string;
  readonly status: ToolInvocationStatus;
  readonly refusalReason: string | undefined;
  readonly resultText: string | undefined;
  readonly observations: readonly ObservationRecord[];
  readonly exitCode: number | undefined;
  readonly durationMs: number | undefined;
  readonly outputTruncated: boolean;
  readonly resolvedOutcome: "applied" | "not_applied" | undefined;
  readonly resolvedByActorId: string | undefined;
  readonly resolutionReason: string | undefined;
  readonly createdAt: Date;
  readonly finishedAt: Date | undefined;
}

export interface ModelCallRecord {
  readonly id: string;
  readonly role: ModelRole;
  readonly provider: string;
  readonly model: string;
  readonly requestJson: string;
  readonly responseText: string;
  readonly toolCallsJson: string;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly latencyMs: number;
  readonly finishReason: string;
  readonly costMicroUsd: number;
}

export interface RunStepRecord {
  readonly id: string;
  readonly runId: string;
  readonly index: number;
  readonly replayability: Replayability;
  readonly runStatusAfter: RunStatus;
  readonly actorId: string | undefined;
  readonly leaseEpoch: number;
  readonly startedAt: Date;
  readonly committedAt: Date;
  readonly modelCall: ModelCallRecord | undefined;
  readonly toolInvocations: readonly ToolInvocationRecord[];
}

export type ArtifactProvenance = "model" | "observed" | "verified";

export interface ArtifactRecord {
  readonly id: string;
  readonly runId: string;
  readonly toolInvocationId: string | undefined;
  readonly type: string;
  readonly schemaVersion: string;
  readonly provenance: ArtifactProvenance;
  readonly inlineData: string | undefined;
  readonly reference: string | undefined;
  readonly subjectArtifactId: string | undefined;
  readonly conclusion: "passed" | "failed" | undefined;
  readonly createdAt: Date;
}

export interface RunEventRecord {
  readonly runId: string;
  readonly seq: number;
  readonly kind: RunEventKind;
  readonly status: RunStatus | undefined;
  readonly stepId: string | undefined;
  readonly toolInvocationId: string | undefined;
  readonly summary: string;
  readonly at: Date;
}

export type EmissionKind = "ack" | "progress" | "reply" | "question";
export type AckState = "working" | "started" | "thinking" | "succeeded" | "failed";
export type DeliveryStatus = "pending" | "delivered" | "failed" | "ambiguous";

export interface EmissionRecord {
  readonly id: string;
  readonly seq: number;
  readonly connector: string;
  readonly kind: EmissionKind;
  readonly runId: string | undefined;
  readonly agentId: string;
  readonly externalConversationId: string;
  readonly replyToMessageId: string | undefined;
  readonly text: string;
  readonly ackState: AckState | undefined;
  readonly idempotencyKey: string;
  readonly addressedActorIds: readonly string[];
  readonly deliveryStatus: DeliveryStatus;
  readonly remoteRef: string | undefined;
  readonly createdAt: Date;
}

/** An emission a worker wants sent, before the ledger gives it an id and a sequence. */
export interface EmissionDraft {
  readonly kind: EmissionKind;
  readonly idempotencyKey: string;
  readonly text: string;
  readonly ackState?: AckState;
  readonly replyToMessageId?: string;
  readonly addressedActorIds: readonly string[];
}

export interface Page<T> {
  readonly items: readonly T[];
  readonly nextPageToken: string;
}
