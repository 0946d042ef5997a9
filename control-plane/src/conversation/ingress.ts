// Admission of connector messages into runs.
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

export interface Admission {
  readonly runId: string;
  readonly status: RunStatus;
  /** The message id was seen before; nothing new was written. */
  readonly duplicate: boolean;
}

/** The ingress port: store the message and admit its run in one transaction. */
export interface IngressStore {
  submitMessage(message: SubmittedMessage): Promise<Admission>;
}

export const ACK_WORKING_TEXT = "⏳";
