// What connectors hand the conversation layer, and what admission answers.
import type { AgentSpec } from "../domain/agent.js";
import type { ConsentAnswer, FollowUpRelation } from "../domain/interrupt.js";
import type { RunStatus } from "../domain/run.js";

export interface SubmittedMessage {
  readonly agentId: string;
  readonly conversationId: string;
  readonly actorId: string;
  readonly actorDisplayName: string;
  readonly messageId: string;
  readonly text: string;
  readonly replyToMessageId: string | undefined;
  readonly connector: string;
}

export interface MessageEdit {
  readonly agentId: string;
  readonly conversationId: string;
  /** The connector's id of the message being edited. */
  readonly messageId: string;
  readonly actorId: string;
  readonly text: string;
}

export interface ContinuationRequest {
  /** The run that ended budget_exhausted. */
  readonly runId: string;
  readonly actorId: string;
  /** The requester's reply to the continuation question, as they wrote it. */
  readonly text: string;
  /** The connector's id of that reply, when it is a message in the conversation. */
  readonly messageId: string | undefined;
}

export interface Admission {
  /** The run the message now belongs to: new, joined, amended, superseding, continuing or cancelled. */
  readonly runId: string;
  readonly status: RunStatus;
  /** The message id was seen before; nothing new was written. */
  readonly duplicate: boolean;
}

export interface Continuation {
  /** The fresh run when authorized, else the exhausted run. */
  readonly runId: string;
  readonly authorized: boolean;
}

/** What the API speaks to. Model questions may make a call take as long as their timeout. */
export interface Mailbox {
  submitMessage(message: SubmittedMessage, signal: AbortSignal): Promise<Admission>;
  editMessage(edit: MessageEdit, signal: AbortSignal): Promise<Admission>;
  continueRun(request: ContinuationRequest, signal: AbortSignal): Promise<Continuation>;
}

/** Answers the mailbox got from the models, passed back into the next attempt. */
export interface AdmissionAnswers {
  /** How the message relates to run `runId`; used only while that run is still the target. */
  readonly relation?: { readonly runId: string; readonly relation: FollowUpRelation; readonly note: string | undefined };
  /** Whether the message consents to continuing exhausted run `runId`. */
  readonly consent?: { readonly runId: string; readonly answer: ConsentAnswer; readonly note: string | undefined };
}

/**
 * One attempt, decided and applied in one transaction. When the plan depends on a model's
 * answer the attempt writes nothing and says which question to ask about which run; the
 * mailbox asks and tries again with the answer.
 */
export type AdmissionAttempt<T> =
  | { readonly kind: "done"; readonly result: T }
  | { readonly kind: "needs_relation"; readonly agent: AgentSpec; readonly runId: string; readonly request: string }
  | { readonly kind: "needs_consent"; readonly agent: AgentSpec; readonly runId: string };

/** One admission attempt per call (conversation/admission.ts). `now` is the clock's, so every window is the caller's time. */
export interface Admissions {
  admit(message: SubmittedMessage, answers: AdmissionAnswers, now: Date): Promise<AdmissionAttempt<Admission>>;
  edit(edit: MessageEdit, now: Date): Promise<Admission>;
  continueRun(request: ContinuationRequest, answers: AdmissionAnswers, now: Date): Promise<AdmissionAttempt<Continuation>>;
}

/** A message id two transactions stored at once: the loser's attempt fails, and its retry finds the duplicate. */
export class ConcurrentMessageError extends Error {
  override readonly name = "ConcurrentMessageError";
  constructor(messageId: string) {
    super(`message ${messageId} was stored concurrently`);
  }
}
