// The RunStore port in memory, for driving the runner in unit tests: one run, fenced by its
// lease epoch as the ledger fences it, with its steps, calls, notices and observations kept
// where a test can read (and change) them.
import type { AgentSpec, Policy } from "../domain/agent.js";
import { LeaseLostError } from "../domain/errors.js";
import type { EmissionDraft } from "../domain/records.js";
import { ZERO_USAGE, type BudgetDimension, type CommitBoundary, type RunStatus, type RunUsage } from "../domain/run.js";
import type { ObservationText } from "../domain/sandbox.js";
import { refusedReply } from "../domain/settlement.js";
import {
  committedIntent,
  settledInvocation,
  type ClaimedRun,
  type Fence,
  type InvocationState,
  type RunControlState,
  type RunHistory,
  type RunInputMessage,
  type RunStore,
  type Settlement,
  type StepCommit,
  type StepState,
  type ToolOutcome,
  type ToolOutcomeCommit,
} from "./run-store.js";

export interface RecordedCommit {
  readonly kind: "step" | "outcome" | "release";
  readonly status: RunStatus;
  readonly summary: string;
  readonly invocationIds: readonly string[];
}

export interface StoredObservation {
  readonly invocationId: string;
  readonly seq: number;
  readonly stream: string;
  readonly text: string;
}

const HELD: ReadonlySet<RunStatus> = new Set(["running", "awaiting_tool"]);

export class InMemoryRunStore implements RunStore {
  readonly runId = "00000000-0000-4000-8000-000000000001";
  status: RunStatus = "queued";
  epoch = 0;
  leaseOwner: string | undefined;
  usage: RunUsage = ZERO_USAGE;
  commitBoundary: CommitBoundary = "buffering";
  waitReason: string | undefined;
  finalReply: string | undefined;
  error: string | undefined;
  exhaustedDimension: BudgetDimension | undefined;
  cancelRequestedByActorId: string | undefined;
  supersededByRunId: string | undefined;
  paused = false;
  policy: Policy;
  messages: RunInputMessage[];
  steps: StepState[] = [];
  readonly emissions: EmissionDraft[] = [];
  readonly commits: RecordedCommit[] = [];
  readonly observations: StoredObservation[] = [];

  constructor(
    readonly agent: AgentSpec,
    request = "please help",
  ) {
    this.policy = agent.policy;
    this.messages = [{ messageId: "m-1", actorId: "alice", text: request, relation: "initial", afterStep: 0, inherited: false }];
  }

  /** What a worker gets from claimNext: the lease at the next epoch. */
  claim(workerId = "worker-1"): ClaimedRun {
    this.epoch += 1;
    this.leaseOwner = workerId;
    const previous = this.status;
    this.status = "running";
    return {
      runId: this.runId,
      epoch: this.epoch,
      agent: this.agent,
      connector: "test",
      status: previous,
      stepCount: this.steps.length,
      usage: this.usage,
      startedAt: new Date(0),
      cancelRequestedByActorId: this.cancelRequestedByActorId,
      supersededByRunId: this.supersededByRunId,
      messages: this.messages,
      triggerCount: this.messages.length,
      requestedByActorId: "alice",
      replyToMessageId: "m-1",
      logicalRequestId: this.runId,
      commitBoundary: this.commitBoundary,
      inheritsFromRunId: undefined,
      conversationId: "00000000-0000-4000-8000-000000000000",
    };
  }

  /** Another worker claims the run: the current holder's next commit is refused. */
  stealLease(): void {
    this.epoch += 1;
    this.leaseOwner = "another-worker";
  }

  invocation(toolName: string): InvocationState | undefined {
    return this.steps.flatMap((s) => s.invocations).find((i) => i.toolName === toolName);
  }

  claimNext(): Promise<ClaimedRun | undefined> {
    return Promise.resolve(this.status === "queued" && !this.paused ? this.claim() : undefined);
  }

  nextDueAt(): Promise<Date | undefined> {
    return Promise.resolve(undefined);
  }

  loadTriggers(): Promise<{ readonly messages: readonly RunInputMessage[]; readonly triggerCount: number }> {
    return Promise.resolve({ messages: [...this.messages], triggerCount: this.messages.length });
  }

  renewLease(_runId: string, workerId: string, epoch: number): Promise<boolean> {
    // As the ledger answers: false only when a claim at a higher epoch took the lease.
    return Promise.resolve((this.leaseOwner === workerId && this.epoch === epoch) || this.epoch <= epoch);
  }

  loadHistory(): Promise<RunHistory> {
    return Promise.resolve({ steps: this.steps.map((s) => ({ ...s, invocations: [...s.invocations] })), artifacts: [], inherited: [] });
  }

  readControl(): Promise<RunControlState> {
    return Promise.resolve(this.control());
  }

  commitStep(commit: StepCommit): Promise<RunControlState> {
    return this.fenced(commit, commit, () => {
      this.settleAll(commit.priorOutcomes ?? []);
      const step = commit.step;
      if (commit.crossesCommitBoundary === true) this.commitBoundary = "committed";
      if (step !== undefined) {
        this.steps.push({
          index: step.index,
          replayability: step.replayability,
          responseText: step.modelCall?.responseText ?? "",
          toolCalls: step.modelCall?.toolCalls ?? [],
          feedback: step.feedback,
          invocations: step.invocations.map(committedIntent),
        });
      }
      this.record("step", commit, step?.invocations.map((i) => i.id) ?? []);
    });
  }

  commitToolOutcome(commit: ToolOutcomeCommit): Promise<RunControlState> {
    return this.fenced(commit, commit, () => {
      this.settleAll([...(commit.priorOutcomes ?? []), commit]);
      this.record("outcome", commit, [commit.invocationId]);
    });
  }

  observationLog(_fence: Fence, invocationId: string): { append(stream: string, text: ObservationText): Promise<void> } {
    return {
      append: (stream, text) => {
        this.observations.push({ invocationId, seq: this.nextSeq(invocationId), stream, text: typeof text === "string" ? text : Buffer.from(text).toString("utf8") });
        return Promise.resolve();
      },
    };
  }

  release(fence: Fence, summary: string): Promise<void> {
    if (!this.holds(fence)) return Promise.reject(new LeaseLostError(fence.runId, fence.epoch));
    this.status = "queued";
    this.leaseOwner = undefined;
    this.commits.push({ kind: "release", status: "queued", summary, invocationIds: [] });
    return Promise.resolve();
  }

  private control(): RunControlState {
    return {
      cancelRequestedByActorId: this.cancelRequestedByActorId,
      supersededByRunId: this.supersededByRunId,
      paused: this.paused,
      policy: this.policy,
      triggerCount: this.messages.length,
    };
  }

  private holds(fence: Fence): boolean {
    return this.epoch === fence.epoch && this.leaseOwner === fence.workerId;
  }

  private fenced(fence: Fence, settlement: Settlement & Pick<StepCommit, "unlessChangedSince">, write: () => void): Promise<RunControlState> {
    if (!this.holds(fence)) return Promise.reject(new LeaseLostError(fence.runId, fence.epoch));
    if (refusedReply(settlement.unlessChangedSince, this.control())) return Promise.resolve(this.control());
    write();
    this.status = settlement.status;
    this.usage = settlement.usage;
    this.waitReason = settlement.waitReason;
    this.finalReply = settlement.finalReply ?? this.finalReply;
    this.error = settlement.error ?? this.error;
    this.exhaustedDimension = settlement.exhaustedDimension ?? this.exhaustedDimension;
    if (!HELD.has(settlement.status)) this.leaseOwner = undefined;
    for (const draft of settlement.emissions) {
      if (!this.emissions.some((e) => e.idempotencyKey === draft.idempotencyKey)) this.emissions.push(draft);
    }
    return Promise.resolve(this.control());
  }

  private settleAll(outcomes: readonly ToolOutcome[]): void {
    for (const outcome of outcomes) {
      this.steps = this.steps.map((step) => ({
        ...step,
        invocations: step.invocations.map((i) => (i.id !== outcome.invocationId ? i : settledInvocation(i, outcome))),
      }));
      // The ledger keeps a call's whole result as its last observation.
      if (outcome.resultText !== "" && outcome.outcome !== "refused") {
        this.observations.push({ invocationId: outcome.invocationId, seq: this.nextSeq(outcome.invocationId), stream: "result", text: outcome.resultText });
      }
    }
  }

  private nextSeq(invocationId: string): number {
    return Math.max(0, ...this.observations.filter((o) => o.invocationId === invocationId).map((o) => o.seq)) + 1;
  }

  private record(kind: RecordedCommit["kind"], settlement: Settlement, invocationIds: readonly string[]): void {
    this.commits.push({ kind, status: settlement.status, summary: settlement.summary, invocationIds });
  }
}
