// What admission needs from the ledger, in its own terms: reads under the conversation's row
// lock and writes of a decided plan. The ledger implements it with SQL and decides nothing.
import type { AgentSpec } from "../domain/agent.js";
import type { EmissionDraft } from "../domain/records.js";
import type { RunEventKind, CommitBoundary, RunStatus } from "../domain/run.js";
import type { TranscriptProgress } from "../domain/transcript-builder.js";
import type { TriageOutcome } from "../domain/triage.js";
import type { SubmittedMessage } from "./ingress.js";

/** A root run of the conversation as the planner needs it, read under its row lock. */
export interface ConversationRun {
  readonly id: string;
  readonly status: RunStatus;
  readonly connector: string;
  readonly startedAt: Date | undefined;
  readonly notBefore: Date;
  /** When its logical request arrived (a successor keeps its predecessor's). */
  readonly requestReceivedAt: Date;
  readonly commitBoundary: CommitBoundary;
  /** It waits on a WorkGraph that is still running. */
  readonly graphRunning: boolean;
  readonly requestedByActorId: string;
  readonly replyToMessageId: string | undefined;
  readonly logicalRequestId: string;
  readonly interruptions: number;
  readonly cancelRequested: boolean;
  /** A continuation of this run exists already. */
  readonly continued: boolean;
  /** Everyone the run answers: its triggers' actors and whoever answered its questions. */
  readonly actorIds: readonly string[];
  /** Its triggers' texts, in order: the request as the fast model is shown it. */
  readonly requestText: string;
}

/** The message being placed: its row, and how its trigger should read. */
export interface IncomingMessage {
  readonly rowId: string;
  readonly externalId: string;
  readonly actorId: string;
  readonly connector: string;
  readonly text: string;
  /** The relation recorded on a trigger that joins or amends (edits say "edit"). */
  readonly relationLabel: "refines" | "edit";
}

/** Where a conversation's emissions go. */
export interface ConversationAddress {
  readonly agent: AgentSpec;
  readonly conversationId: string;
  readonly externalConversationId: string;
}

/** The conversation's runs as the planner reads them, under the conversation's row lock. */
export interface ConversationRuns {
  /** Live root runs and the newest root run, oldest first, locked. */
  readonly runs: ConversationRun[];
  /** The conversation's latest progress notices, oldest first, for a run started at once (its first model call then waits on no read). */
  readonly earlierProgress: TranscriptProgress[];
}

export type StoredMessage =
  | ({ readonly kind: "stored"; readonly agent: AgentSpec; readonly conversationId: string; readonly messageRowId: string } & ConversationRuns)
  | { readonly kind: "duplicate"; readonly runId: string; readonly status: RunStatus }
  /** Another transaction is storing the same message id right now. */
  | { readonly kind: "concurrent" };

/** Claiming a new run in the transaction that admits it, for a reserved worker. */
export interface StartClaim {
  readonly workerId: string;
  readonly leaseMs: number;
}

export interface NewRunDraft {
  readonly runId: string;
  readonly connector: string;
  readonly requesterId: string;
  readonly replyToMessageId: string;
  readonly logicalRequestId: string;
  readonly requestReceivedAt: Date;
  readonly notBefore: Date;
  readonly interruptions: number;
  readonly inheritsFromRunId?: string;
  readonly continuationOfRunId?: string;
  /** Triggers carried over from this run, shown with the inherited work. */
  readonly carryTriggersOf?: string;
  /** Whether the carried messages now belong to the new run (a successor), or stay (a continuation). */
  readonly moveCarriedMessages?: boolean;
  readonly trigger: { readonly incoming: IncomingMessage; readonly relation: string };
  readonly summary: string;
  /** A new logical request's hourglass, on the message that started it; a successor has none of its own. */
  readonly ack?: { readonly messageId: string; readonly actorId: string; readonly text: string; readonly idempotencyKey: string };
  /** Claim the run for this worker in the same statement when the ceilings allow. */
  readonly claim?: StartClaim;
  /** Acks reserved with the run when the claim starts it (its started and thinking acks). */
  readonly startAcks?: readonly EmissionDraft[];
  /** A triage known at admission (no fast model to ask), stored with the run instead of after it. */
  readonly triage?: TriageOutcome;
}

export interface TriggerDraft {
  readonly relation: string;
  /** Read by the running run at its next step (an amendment), rather than before it starts. */
  readonly amends: boolean;
  readonly notBefore: Date | undefined;
}

export interface RunStopDraft {
  readonly run: ConversationRun;
  readonly actorId: string;
  readonly reason: string;
  readonly addressedActorIds: readonly string[];
  readonly supersededBy?: string;
}

export interface EventDraft {
  readonly kind: RunEventKind;
  readonly status?: RunStatus;
  readonly summary: string;
}

/** Reads and writes of one admission attempt, inside its transaction. */
export interface ConversationLedger {
  /**
   * The agent, the actor, the conversation (locking its row) and the message, idempotent on the
   * message id; a stored message comes with the conversation's runs, read once the lock is held.
   */
  storeMessage(message: SubmittedMessage): Promise<StoredMessage>;
  /** The conversation's runs, by the connector's id of the conversation (whose row lock the caller holds). */
  conversationRuns(agentId: string, externalConversationId: string): Promise<ConversationRuns>;
  /**
   * Inserts a root run with its triggers, first event and ack; true when it was claimed for
   * `draft.claim`. With a claim it is the attempt's last write, which the ledger may commit with it.
   */
  insertRun(address: ConversationAddress, draft: NewRunDraft, now: Date): Promise<boolean>;
  addTrigger(runId: string, incoming: IncomingMessage, how: TriggerDraft, now: Date): Promise<void>;
  addCancelTrigger(runId: string, incoming: IncomingMessage, reason: string, now: Date): Promise<void>;
  /** Ends a run no worker holds, with its stop notices. */
  stopParkedRun(address: ConversationAddress, stop: RunStopDraft): Promise<void>;
  /** Asks the worker holding a run to stop at its next safe point. */
  requestStop(stop: RunStopDraft): Promise<void>;
  attachMessage(runId: string | undefined, messageRowId: string): Promise<void>;
  appendEvents(runId: string, events: readonly EventDraft[]): Promise<void>;
  /** A worker may have skipped a run this transaction held locked: let one look again. */
  wakeWorkers(runId: string): void;
  runStatus(runId: string): Promise<RunStatus>;
}

/** The message an edit changes, with what the edit needs to know of it. */
export interface OriginalMessage {
  readonly rowId: string;
  readonly actorId: string;
  readonly runId: string | undefined;
  readonly latestText: string;
  readonly edits: number;
  readonly connector: string;
}

/** A run asked to be continued, with where it lives. */
export interface ContinuableRun extends ConversationRun {
  readonly isRoot: boolean;
  readonly address: ConversationAddress;
}

/** Reads and writes for edits and continuations, inside the same transaction. */
export interface FollowUpLedger {
  /** The conversation and its agent, locking the conversation's row; undefined when unknown. */
  lockConversation(agentId: string, externalConversationId: string): Promise<ConversationAddress | undefined>;
  originalMessage(conversationId: string, externalMessageId: string): Promise<OriginalMessage | undefined>;
  /** The run of the newest version of a message (an unchanged edit answers with it). */
  latestVersionRunId(original: OriginalMessage): Promise<string | undefined>;
  /** Stores an edit as a message of its own and marks the original edited; returns its row id. */
  storeEdit(conversationId: string, original: OriginalMessage, edit: { externalId: string; actorId: string; text: string }, now: Date): Promise<string>;
  /** Runs whose triggers carry any version of the message. */
  runsCarrying(original: OriginalMessage): Promise<ReadonlySet<string>>;
  /** The run, locked, with its conversation and agent. */
  continuableRun(runId: string): Promise<ContinuableRun | undefined>;
  /** The continuation of a run, if one was made, and the message that authorized it. */
  continuationOf(runId: string): Promise<{ runId: string; externalMessageId: string | undefined } | undefined>;
  /** Stores a reply (idempotent on its external id) by an actor; returns its row id. */
  storeReply(conversationId: string, actorId: string, externalId: string, text: string): Promise<string>;
}

/** The ledger side of admission: attempts in transactions. */
export interface AdmissionLedger {
  /** Runs `work` in one transaction: committed when `keep(result)`, rolled back otherwise (or when it throws). */
  attempt<T>(work: (ledger: ConversationLedger & FollowUpLedger) => Promise<T>, keep: (result: T) => boolean): Promise<T>;
}
