import type { AgentSpec } from "../domain/agent.js";
import type { EmissionDraft } from "../domain/records.js";
import type { BudgetDimension, ModelRole, Replayability, RunStatus, RunUsage } from "../domain/run.js";

export interface RunInputMessage {
  readonly messageId: string;
  readonly actorId: string;
  readonly text: string;
}

/** A run a worker holds a lease on, with everything needed to take its next step. */
export interface ClaimedRun {
  readonly runId: string;
  readonly epoch: number;
  readonly agent: AgentSpec;
  readonly status: RunStatus;
  readonly stepCount: number;
  readonly usage: RunUsage;
  readonly startedAt: Date;
  readonly cancelRequestedByActorId: string | undefined;
  readonly messages: readonly RunInputMessage[];
  readonly requestedByActorId: string;
  readonly replyToMessageId: string | undefined;
}

export interface ModelCallCommit {
  readonly id: string;
  readonly role: ModelRole;
  readonly provider: string;
  readonly model: string;
  readonly request: unknown;
  readonly responseText: string;
  readonly toolCalls: unknown;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly latencyMs: number;
  readonly finishReason: string;
  readonly costMicroUsd: number;
}

/** Everything one iteration produced; the store writes it in one transaction or not at all. */
export interface StepCommit {
  readonly runId: string;
  readonly workerId: string;
  readonly epoch: number;
  readonly step:
    | {
        readonly id: string;
        readonly index: number;
        readonly replayability: Replayability;
        readonly actorId: string | undefined;
        readonly startedAt: Date;
        readonly modelCall: ModelCallCommit | undefined;
      }
    | undefined;
  readonly status: RunStatus;
  readonly usage: RunUsage;
  readonly finalReply?: string;
  readonly error?: string;
  readonly exhaustedDimension?: BudgetDimension;
  readonly emissions: readonly EmissionDraft[];
  readonly summary: string;
}

/** The runner's port to the ledger. */
export interface RunStore {
  /** Claims the oldest runnable run (FOR UPDATE SKIP LOCKED), raising its fencing epoch. */
  claimNext(workerId: string, leaseMs: number): Promise<ClaimedRun | undefined>;
  /** Extends the lease; false when another worker has taken it. */
  renewLease(runId: string, workerId: string, epoch: number, leaseMs: number): Promise<boolean>;
  /** Commits one iteration. Throws LeaseLostError if the epoch is no longer current. */
  commitStep(commit: StepCommit): Promise<void>;
}
