// One claim of a run as the driver's phases share it: what the worker knows of the run (its
// committed history, control state and input, kept in step with every commit so an iteration
// needs no reads) and the fenced commits that change it.
import type { Logger } from "pino";
import type { ModelProviderName } from "../domain/agent.js";
import type { BudgetCheck } from "../domain/budget.js";
import type { CompactionOptions } from "../domain/compaction.js";
import type { PreviousModelRequest } from "../domain/model-request.js";
import type { CommitBoundary, RunStatus, RunUsage } from "../domain/run.js";
import { createRunRedactor, runSecrets, type RunRedactor } from "../domain/redaction.js";
import type { ObservationText } from "../domain/sandbox.js";
import type { SettlementAudience } from "../domain/settlement.js";
import type { ModelProvider } from "../models/model-provider.js";
import type { ToolRegistry } from "../tools/tool-registry.js";
import type { RunLifecycle } from "./run-lifecycle.js";
import type { PhaseLatencies, RunTracing } from "./run-telemetry.js";
import {
  committedIntent,
  settledInvocation,
  type ClaimedRun,
  type Fence,
  type InvocationState,
  type RunControlState,
  type RunHistory,
  type ConversationHistory,
  type RunInputMessage,
  type RunStore,
  type StepCommit,
  type ToolOutcomeCommit,
} from "./run-store.js";

export interface RunnerDeps {
  readonly store: RunStore;
  /** A fresh run's read of its conversation's other runs (recent progress); without it, none. */
  readonly conversationHistory?: ConversationHistory;
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly tools: ToolRegistry;
  readonly now: () => Date;
  readonly log: Logger;
  /** Consecutive turns the model may get wrong (bad tool, bad arguments, unmet contract) before the run fails. */
  readonly maxInvalidTurns: number;
  readonly compaction?: CompactionOptions;
  /**
   * How long a finished read's result may wait to be committed with the run's next commit
   * (read-outcome-batching.ts); 0 commits every result on its own. Default DEFAULT_READ_FLUSH_MS.
   */
  readonly readFlushMs?: number;
  /**
   * Calls `listener` with a run's id when its control state (cancellation, supersession, pause,
   * triggers) changed, or with "" when any run's may have (a policy change, a lost notification).
   * Without it, a held read's control state is read after every read.
   */
  readonly controlChanges?: (listener: (runId: string) => void) => () => void;
  /** Where the run's granted secret values are read from (the control plane's environment), to redact them. */
  readonly secretEnv?: Readonly<Record<string, string | undefined>>;
  /** Started/thinking acks and the usage of side model calls (run-lifecycle.ts); without it, neither. */
  readonly lifecycle?: RunLifecycle;
  /**
   * Told the root's id when a WorkGraph child's claim ends, so the graph's scheduler looks at once;
   * the worker waits for that pass before it claims again, so the two never compete for the ledger.
   */
  readonly childClaimEnded?: (rootRunId: string) => Promise<void>;
  /** Told of each run this process ended, once its end is committed (admission's quiet conversations). */
  readonly runEnded?: (runId: string, status: RunStatus) => void;
  /** Spans per claim, step, model call and tool call (run-telemetry.ts); absent when tracing is off. */
  readonly tracing?: RunTracing;
  /** Step, model-call and tool-call latencies for /metrics. */
  readonly latencies?: PhaseLatencies;
}

export interface StepContext {
  readonly workerId: string;
  readonly signal: AbortSignal;
}

/** The reply, error and summary a run settles with. */
export interface SettleOutcome {
  readonly summary: string;
  readonly replyText?: string;
  readonly finalReply?: string;
  readonly error?: string;
}

/** A step as a StepCommit carries it. */
export type StepDraft = NonNullable<StepCommit["step"]>;

/**
 * What a phase of the driver says happens next. `continue` goes on (the next iteration, or the
 * step's next call); `park` ends this claim with nothing left to commit (the phase committed the
 * run's reply, where it waits, or its hand-back); the others end the run, and the driver commits
 * them (run-settlement.ts).
 */
export type Next =
  | { readonly kind: "continue" }
  | { readonly kind: "park" }
  | { readonly kind: "settle"; readonly status: "failed"; readonly outcome: SettleOutcome; readonly step?: StepDraft }
  | { readonly kind: "exhaust"; readonly check: BudgetCheck; readonly step?: StepDraft }
  | { readonly kind: "cancel"; readonly actorId: string }
  | { readonly kind: "supersede"; readonly successorId: string };

export const CONTINUE: Next = { kind: "continue" };
export const PARK: Next = { kind: "park" };

/** How a call that never finished is settled without running it. */
export interface ToolSettlement {
  readonly summary: string;
  readonly refusalReason?: string;
  readonly resolvedOutcome?: "applied" | "not_applied";
  readonly waitReason?: "unknown_write_outcome";
}

export class RunSession {
  usage: RunUsage;
  stepIndex: number;
  invalidTurns = 0;
  /** The committed state, kept in step with every commit so an iteration needs no reads. */
  history: RunHistory = { steps: [], artifacts: [], inherited: [] };
  control: RunControlState;
  /** The run's input: its triggers, read again when a commit reports that an amendment arrived. */
  messages: readonly RunInputMessage[];
  triggerCount: number;
  commitBoundary: CommitBoundary;
  /** This worker's last model call on the run: the next one is stored as a delta on it. */
  previousRequest: PreviousModelRequest | undefined;
  readonly fence: Fence;
  readonly log: Logger;
  /** This claim's secrets, kept out of every text the phases commit (model turns, results, replies). */
  readonly redactor: RunRedactor;

  constructor(
    readonly deps: RunnerDeps,
    readonly claimed: ClaimedRun,
    readonly context: StepContext,
  ) {
    this.usage = claimed.usage;
    this.stepIndex = claimed.stepCount;
    this.fence = { runId: claimed.runId, workerId: context.workerId, epoch: claimed.epoch };
    this.control = {
      cancelRequestedByActorId: claimed.cancelRequestedByActorId,
      supersededByRunId: claimed.supersededByRunId,
      paused: false,
      policy: claimed.agent.policy,
      triggerCount: claimed.triggerCount,
    };
    this.messages = claimed.messages;
    this.triggerCount = claimed.triggerCount;
    this.commitBoundary = claimed.commitBoundary;
    this.log = deps.log.child({ runId: claimed.runId, workerId: context.workerId, epoch: claimed.epoch });
    this.redactor = createRunRedactor(runSecrets(claimed.agent, deps.secretEnv ?? {}));
  }

  get store(): RunStore {
    return this.deps.store;
  }

  async loadHistory(): Promise<void> {
    this.history = await this.store.loadHistory(this.claimed.runId);
  }

  /** Reads the run's input again after a commit reported an amendment. */
  async reloadTriggers(): Promise<void> {
    const input = await this.store.loadTriggers(this.claimed.runId);
    this.messages = input.messages;
    this.triggerCount = input.triggerCount;
  }

  /** Commits a step and keeps the in-memory history and control state in step with the ledger. */
  async commitStep(commit: StepCommit): Promise<void> {
    this.control = await this.store.commitStep(commit);
    if (commit.crossesCommitBoundary === true) this.commitBoundary = "committed";
    const step = commit.step;
    if (step === undefined) return;
    const invocations = step.invocations.map(committedIntent);
    const committed = {
      index: step.index,
      replayability: step.replayability,
      responseText: step.modelCall?.responseText ?? "",
      toolCalls: step.modelCall?.toolCalls ?? [],
      feedback: step.feedback,
      invocations,
    };
    this.history = { ...this.history, steps: [...this.history.steps, committed] };
  }

  /** Commits a call's outcome, redacted: every tool result (run, recovered, refused) passes here. */
  async commitToolOutcome(unredacted: ToolOutcomeCommit): Promise<void> {
    const commit = this.redactor.active ? redactedOutcome(unredacted, this.redactor) : unredacted;
    this.control = await this.store.commitToolOutcome(commit);
    const now = this.deps.now();
    const artifacts = commit.artifacts.map((artifact) => ({
      id: artifact.id,
      runId: this.claimed.runId,
      toolInvocationId: commit.invocationId,
      type: artifact.type,
      schemaVersion: artifact.schemaVersion,
      provenance: artifact.provenance,
      inlineData: artifact.inlineData,
      reference: artifact.reference,
      subjectArtifactId: artifact.subjectArtifactId,
      conclusion: artifact.conclusion,
      createdAt: now,
    }));
    this.history = {
      inherited: this.history.inherited,
      steps: withSettled(this.history.steps, commit),
      artifacts: artifacts.length === 0 ? this.history.artifacts : [...this.history.artifacts, ...artifacts],
    };
  }

  /** Settles a call without running it (refused, interrupted, outcome unknown), moving the run to `status`. */
  async settleTool(
    invocation: { readonly id: string; readonly effect: "read" | "write" },
    outcome: "interrupted" | "unknown_outcome" | "refused",
    status: RunStatus,
    how: ToolSettlement,
  ): Promise<void> {
    await this.commitToolOutcome({
      ...this.fence,
      invocationId: invocation.id,
      effect: invocation.effect,
      outcome,
      resultText: "",
      artifacts: [],
      ...(how.refusalReason === undefined ? {} : { refusalReason: how.refusalReason }),
      ...(how.resolvedOutcome === undefined ? {} : { resolvedOutcome: how.resolvedOutcome, answeredByActorId: "lookup" }),
      ...(how.waitReason === undefined ? {} : { waitReason: how.waitReason }),
      status,
      usage: this.usage,
      emissions: [],
      summary: how.summary,
    });
  }

  /** Refuses calls the step will not run, leaving the run awaiting its tools. */
  async refuseAll(invocations: readonly { readonly id: string; readonly effect: "read" | "write" }[], summary: string, refusalReason: string): Promise<void> {
    for (const invocation of invocations) await this.settleTool(invocation, "refused", "awaiting_tool", { summary, refusalReason });
  }

  /** Who the run's notices go to and what they answer. */
  audience(): SettlementAudience {
    return {
      runId: this.claimed.runId,
      logicalRequestId: this.claimed.logicalRequestId,
      replyToMessageId: this.claimed.replyToMessageId,
      addressedActorIds: [...new Set(this.messages.map((m) => m.actorId))],
    };
  }

  /** Who the step acts for: the last actor who answered a question in this run, else the requester. */
  actorOfStep(): string {
    const steps = this.history.steps;
    for (let s = steps.length - 1; s >= 0; s--) {
      const invocations = steps[s]!.invocations;
      for (let i = invocations.length - 1; i >= 0; i--) {
        const invocation = invocations[i]!;
        if (invocation.resolvedByActorId !== undefined && invocation.status === "succeeded") return invocation.resolvedByActorId;
      }
    }
    return this.claimed.requestedByActorId;
  }

  /** The run's writes that took effect, by tool name, in order. */
  effectsDone(): string[] {
    return this.history.steps
      .flatMap((s) => s.invocations)
      .filter((i) => i.effect === "write" && (i.status === "succeeded" || i.resolvedOutcome === "applied"))
      .map((i) => i.toolName);
  }

  elapsed(): number {
    return Math.max(0, this.deps.now().getTime() - this.claimed.startedAt.getTime());
  }

  /** Where a tool call's observations go; the ledger numbers them (RunStore.observationLog). */
  observe(invocationId: string): (stream: string, text: ObservationText) => Promise<void> {
    const log = this.store.observationLog(this.fence, invocationId);
    return (stream, text) => log.append(stream, text);
  }
}

/**
 * The steps with one call settled. Only the step holding the call is rebuilt, found from the
 * newest (where a result almost always belongs): settling stays O(1) as the history grows.
 */
function withSettled(steps: RunHistory["steps"], commit: ToolOutcomeCommit): RunHistory["steps"] {
  for (let s = steps.length - 1; s >= 0; s--) {
    const step = steps[s]!;
    const at = step.invocations.findIndex((invocation) => invocation.id === commit.invocationId);
    if (at < 0) continue;
    const invocations: InvocationState[] = [...step.invocations];
    invocations[at] = settledInvocation(invocations[at]!, commit);
    const settled = [...steps];
    settled[s] = { ...step, invocations };
    return settled;
  }
  return steps;
}

function redactedOutcome(commit: ToolOutcomeCommit, redactor: RunRedactor): ToolOutcomeCommit {
  return {
    ...commit,
    resultText: redactor.text(commit.resultText),
    summary: redactor.text(commit.summary),
    ...(commit.refusalReason === undefined ? {} : { refusalReason: redactor.text(commit.refusalReason) }),
    artifacts: commit.artifacts.map((artifact) => ({
      ...artifact,
      ...(artifact.inlineData === undefined ? {} : { inlineData: redactor.text(artifact.inlineData) }),
      ...(artifact.reference === undefined ? {} : { reference: redactor.text(artifact.reference) }),
    })),
  };
}
