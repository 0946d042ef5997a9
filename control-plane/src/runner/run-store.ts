import type { AgentSpec, Policy, ToolEffect } from "../domain/agent.js";
import type { StoredModelRequest } from "../domain/model-request.js";
import type { ArtifactRecord, EmissionDraft, ToolInvocationStatus } from "../domain/records.js";
import type { ObservationText } from "../domain/sandbox.js";
import type { BudgetDimension, CommitBoundary, ModelRole, Replayability, RunStatus, RunUsage } from "../domain/run.js";
import type { ReplyGuard } from "../domain/settlement.js";
import type { SideCallUsage } from "../domain/triage.js";
import type { TranscriptInvocation, TranscriptProgress, TranscriptStep } from "../domain/transcript-builder.js";
import type { ToolCallRequest } from "../domain/transcript.js";
import type { ArtifactDraft } from "../tools/tool-registry.js";

export interface RunInputMessage {
  readonly messageId: string;
  readonly actorId: string;
  readonly text: string;
  /** initial, coalesced, refines, amends, cancels, edit or continues. */
  readonly relation: string;
  /** Shown to the model after this many of the run's own steps (an amendment arrives mid-run). */
  readonly afterStep: number;
  /** Carried over from the run this one supersedes or continues: shown with the inherited work. */
  readonly inherited: boolean;
}

/** A run a worker holds a lease on, with what it needs to take the next step. */
export interface ClaimedRun {
  readonly runId: string;
  readonly epoch: number;
  readonly agent: AgentSpec;
  readonly connector: string;
  readonly status: RunStatus;
  readonly stepCount: number;
  readonly usage: RunUsage;
  readonly startedAt: Date;
  readonly cancelRequestedByActorId: string | undefined;
  /** Superseded while no worker held it (or its worker died): it stops silently at the first safe point. */
  readonly supersededByRunId: string | undefined;
  readonly messages: readonly RunInputMessage[];
  /** How many triggers `messages` reflects; a commit reporting more means new input arrived. */
  readonly triggerCount: number;
  readonly requestedByActorId: string;
  readonly replyToMessageId: string | undefined;
  /** The request the run answers; its acks are keyed on this, not on the run. */
  readonly logicalRequestId: string;
  readonly commitBoundary: CommitBoundary;
  /** The run whose completed work this one starts from, if any (see RunHistory.inherited). */
  readonly inheritsFromRunId: string | undefined;
  /** The conversation the run answers in (ConversationHistory reads its other runs). */
  readonly conversationId: string;
  /** The conversation's latest progress notices, oldest first, when admission read them; else the worker reads them. */
  readonly earlierProgress?: readonly TranscriptProgress[];
  /** Its started and thinking acks went in with it (a run admission started): its first model call reserves none. */
  readonly startAcksReserved?: true;
  /** A WorkGraph child run's root: it sends no acks or replies; its end is its node's result. */
  readonly parentRunId?: string;
}

/** A committed tool call: what the transcript needs, plus what recovery and dispatch need. */
export interface InvocationState extends TranscriptInvocation {
  readonly id: string;
  readonly effect: ToolEffect;
  readonly argumentsJson: string;
}

export interface StepState extends TranscriptStep {
  readonly index: number;
  readonly replayability: Replayability;
  readonly invocations: readonly InvocationState[];
}

/** Everything committed so far: the durable state a resumed worker starts from. */
export interface RunHistory {
  readonly steps: readonly StepState[];
  readonly artifacts: readonly ArtifactRecord[];
  /**
   * Completed work of the run this one superseded or continues, oldest first, shown to the
   * model before the run's own steps. Never recovered, never re-executed: it is history.
   */
  readonly inherited: readonly StepState[];
  /** The conversation's latest progress notices from earlier runs, oldest first (shown labelled as progress). */
  readonly progress?: readonly TranscriptProgress[];
}

export interface ModelCallCommit {
  readonly id: string;
  readonly role: ModelRole;
  readonly provider: string;
  readonly model: string;
  /** Whole, or a delta on the run's previous call (see domain/model-request.ts). */
  readonly request: StoredModelRequest;
  readonly responseText: string;
  readonly toolCalls: readonly ToolCallRequest[];
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly latencyMs: number;
  readonly finishReason: string;
  readonly costMicroUsd: number;
}

/** A tool call's intent, written before anything is dispatched. */
export interface InvocationIntent {
  readonly id: string;
  readonly providerCallId: string;
  readonly ordinal: number;
  readonly toolName: string;
  readonly toolVersion: string;
  readonly effect: ToolEffect;
  readonly argumentsJson: string;
  /** "pending" to dispatch, "refused" when validation or policy said no. */
  readonly status: "pending" | "refused";
  readonly refusalReason?: string;
}

/** A call as the run's history holds it once its intent is committed, before any outcome. */
export function committedIntent(intent: InvocationIntent): InvocationState {
  return {
    id: intent.id,
    providerCallId: intent.providerCallId,
    toolName: intent.toolName,
    effect: intent.effect,
    argumentsJson: intent.argumentsJson,
    status: intent.status,
    resultText: undefined,
    refusalReason: intent.refusalReason,
    resolvedOutcome: undefined,
    resolvedByActorId: undefined,
    resolutionReason: undefined,
  };
}

/** A call once its outcome is committed. */
export function settledInvocation(invocation: InvocationState, outcome: ToolOutcome): InvocationState {
  return {
    ...invocation,
    status: outcome.outcome,
    resultText: outcome.resultText,
    refusalReason: outcome.refusalReason ?? invocation.refusalReason,
    resolvedOutcome: outcome.resolvedOutcome ?? invocation.resolvedOutcome,
    resolvedByActorId: outcome.answeredByActorId ?? invocation.resolvedByActorId,
  };
}

export interface Fence {
  readonly runId: string;
  readonly workerId: string;
  readonly epoch: number;
}

export interface Settlement {
  /**
   * Results of read calls that finished since the last commit, committed atomically with this
   * one, before it (see read-outcome-batching.ts). Until then a crash finds them pending,
   * and recovery marks them interrupted, as for any read.
   */
  readonly priorOutcomes?: readonly ToolOutcome[];
  readonly status: RunStatus;
  readonly usage: RunUsage;
  readonly finalReply?: string;
  readonly error?: string;
  readonly exhaustedDimension?: BudgetDimension;
  readonly waitReason?: "unknown_write_outcome";
  readonly emissions: readonly EmissionDraft[];
  readonly summary: string;
}

/** One iteration's model turn and the intents of its tool calls, with the run's new status. */
export interface StepCommit extends Fence, Settlement {
  readonly step:
    | {
        readonly id: string;
        readonly index: number;
        readonly replayability: Replayability;
        readonly actorId: string | undefined;
        readonly startedAt: Date;
        readonly modelCall: ModelCallCommit | undefined;
        readonly invocations: readonly InvocationIntent[];
        readonly feedback?: string;
      }
    | undefined;
  /** The step's first external effect moves the run past its commit boundary. */
  readonly crossesCommitBoundary?: boolean;
  /**
   * The step settles the run with the model's reply, decided on the control state the worker
   * last saw: no stop, and (when `triggerCount` is given) its input as of that many triggers. If
   * a stop (cancellation, supersession) or another trigger has been committed since, nothing is
   * written and the returned state shows it (see refusedReply in domain/settlement.ts).
   */
  readonly unlessChangedSince?: ReplyGuard;
}

/** One tool call's result, with its artifacts, committed atomically. */
export interface ToolOutcomeCommit extends Fence, Settlement, ToolOutcome {}

/** A tool call's result and artifacts. */
export interface ToolOutcome {
  readonly invocationId: string;
  /** The call's effect class: a write's outcome must be durable before anything else happens. */
  readonly effect: ToolEffect;
  readonly outcome: Exclude<ToolInvocationStatus, "pending">;
  readonly resultText: string;
  readonly refusalReason?: string;
  readonly exitCode?: number;
  readonly durationMs?: number;
  readonly truncated?: boolean;
  /** Ids are the runner's, so it can keep evaluating completion without reading them back. */
  readonly artifacts: readonly (ArtifactDraft & { readonly id: string })[];
  /** Who answered (keel.ask_user) or who resolved an unknown outcome ("lookup" for a tool's own lookup). */
  readonly answeredByActorId?: string;
  readonly resolvedOutcome?: "applied" | "not_applied";
}

/**
 * What may change under a running worker: cancellation, pause, and the agent's policy.
 * Every fenced commit reads it back, so a decision after a commit (dispatch a call, take
 * another step) uses the state as of that commit without another query.
 */
export interface RunControlState {
  readonly cancelRequestedByActorId: string | undefined;
  /** Set when a refinement superseded the run: it stops without a reply; its successor answers. */
  readonly supersededByRunId: string | undefined;
  readonly paused: boolean;
  readonly policy: Policy;
  /** Triggers on the run as of the commit; more than the worker has read means an amendment arrived. */
  readonly triggerCount: number;
  /** The usage of model calls beside the loop as of the commit, so the next model call need not read it; a store that does not keep it leaves it out. */
  readonly sideUsage?: SideCallUsage;
}

/** One call's observations, numbered by the ledger (RunStore.observationLog). */
export interface ObservationLog {
  /** Takes the observation's place in the sequence at once, so appends in flight side by side keep their order. */
  append(stream: string, text: ObservationText): Promise<void>;
}

/** The runner's port to the ledger. Every write is fenced by the lease epoch. */
export interface RunStore {
  /**
   * Claims the oldest runnable run (FOR NO KEY UPDATE SKIP LOCKED), raising its fencing epoch. A queued
   * root run is admitted only when its conversation has no other run in flight and neither its
   * agent's nor the install's ceiling on concurrent root runs is reached.
   */
  claimNext(workerId: string, leaseMs: number): Promise<ClaimedRun | undefined>;
  /** When the earliest run held back by its coalesce window comes due, if any. */
  nextDueAt(): Promise<Date | undefined>;
  /** The run's triggers as they are now, after an amendment. */
  loadTriggers(runId: string): Promise<{ readonly messages: readonly RunInputMessage[]; readonly triggerCount: number }>;
  /** Extends the lease; false only when a claim at a higher epoch has taken it (not when the worker let go). */
  renewLease(runId: string, workerId: string, epoch: number, leaseMs: number): Promise<boolean>;
  loadHistory(runId: string): Promise<RunHistory>;
  /** Commits one model turn and its calls' intents; returns the run's control state as of the commit. */
  commitStep(commit: StepCommit): Promise<RunControlState>;
  /** The run's control state as it is now, without committing anything. */
  readControl(runId: string): Promise<RunControlState>;
  /** Commits one call's result with its artifacts; returns the run's control state as of the commit. */
  commitToolOutcome(commit: ToolOutcomeCommit): Promise<RunControlState>;
  /**
   * Where one call's output goes as it arrives, fenced like every write: once another worker
   * holds the run, an append fails with LeaseLostError and stores nothing, so a stale worker's
   * stream never mixes into the new holder's. The ledger numbers a call's observations: in the
   * order `append` is called, after any it already holds for the call (a call re-attached after
   * a restart continues its stream), and the call's result after them all.
   */
  observationLog(fence: Fence, invocationId: string): ObservationLog;
  /** Gives the run back: queued again (paused, or shutting down) with the lease cleared. */
  release(fence: Fence, summary: string): Promise<void>;
}

/**
 * Reads of a conversation's other runs, for a fresh run's first model call. They are committed
 * before this run exists, so an early-started run reads them without waiting for its own commit.
 */
export interface ConversationHistory {
  /** The conversation's latest progress notices from runs other than `exceptRunId`, oldest first. */
  recentProgress(conversationId: string, exceptRunId: string): Promise<readonly TranscriptProgress[]>;
}
