// Slack → Keel: a mention of the bot, or a reply in a thread the bot is in, becomes SubmitMessage
// (or AnswerInput when it answers the thread's open question from someone it was asked of); an
// edit becomes EditMessage. Each Socket Mode envelope is acknowledged once Keel has the message,
// so a Keel outage makes Slack redeliver it, and Keel's idempotency on the message id absorbs that.
import { Code, ConnectError } from "@connectrpc/connect";
import type { KeelClients } from "../shared/keel-client.js";
import type { StateStore } from "./state.js";

export interface InboundOptions {
  readonly ingress: KeelClients["ingress"];
  readonly state: StateStore;
  readonly agentId: string;
  readonly connector: string;
  /** The bot's own user id (auth.test): its mention is stripped, its messages ignored. */
  readonly botUserId: string;
  readonly onEvent?: (event: InboundEvent) => void;
}

export type InboundEvent = {
  readonly type: "submitted" | "answered" | "edited" | "ignored" | "keel-error";
  readonly conversationId?: string;
  readonly messageId?: string;
  readonly runId?: string;
  readonly detail?: string;
};

/** The fields of a Slack message event this connector reads. */
export interface SlackMessage {
  readonly type?: string;
  readonly subtype?: string;
  readonly channel?: string;
  readonly user?: string;
  readonly bot_id?: string;
  readonly text?: string;
  readonly ts?: string;
  readonly thread_ts?: string;
  readonly message?: SlackMessage;
  readonly previous_message?: SlackMessage;
}

/** Keel answers that mean "try later": the envelope is left unacknowledged so Slack sends it again. */
const TRANSIENT = new Set([Code.Unavailable, Code.DeadlineExceeded, Code.ResourceExhausted, Code.Aborted, Code.Internal, Code.Unknown]);

export function createInbound(options: InboundOptions) {
  const { state } = options;
  const emit = options.onEvent ?? (() => undefined);
  const mention = `<@${options.botUserId}>`;
  const fromBot = (message: SlackMessage) => message.bot_id !== undefined || message.user === options.botUserId || message.user === undefined;
  const textOf = (message: SlackMessage) => (message.text ?? "").split(mention).join("").replace(/\s+/g, " ").trim();

  /** Handles one event; resolves true when its envelope may be acknowledged. */
  async function handle(event: SlackMessage): Promise<boolean> {
    try {
      if (event.type === "app_mention") await onMessage(event, true);
      else if (event.type === "message" && event.subtype === "message_changed") await onEdit(event);
      else if (event.type === "message" && (event.subtype === undefined || event.subtype === "thread_broadcast" || event.subtype === "file_share")) await onMessage(event, false);
      else emit({ type: "ignored", detail: `${event.type ?? "?"}/${event.subtype ?? ""}` });
      return true;
    } catch (error) {
      const keel = ConnectError.from(error);
      emit({ type: "keel-error", detail: `${Code[keel.code]}: ${keel.rawMessage}` });
      return !TRANSIENT.has(keel.code);
    }
  }

  async function onMessage(message: SlackMessage, mentioned: boolean): Promise<void> {
    const { channel, ts, user } = message;
    if (channel === undefined || ts === undefined || user === undefined || fromBot(message)) return emit({ type: "ignored", detail: "not a person's message" });
    const conversationId = `${channel}:${message.thread_ts ?? ts}`;
    if (!mentioned) {
      // Plain messages count only as replies in a thread the bot is in; a mention arrives as app_mention too.
      if (message.thread_ts === undefined || message.thread_ts === ts || !state.knowsThread(conversationId)) return emit({ type: "ignored", conversationId, detail: "not in a thread of ours" });
      if ((message.text ?? "").includes(mention)) return emit({ type: "ignored", conversationId, detail: "handled as app_mention" });
    }
    state.addThread(conversationId);
    const text = textOf(message);
    if (text === "") return emit({ type: "ignored", conversationId, detail: "empty" });
    const question = state.current.questions[conversationId];
    if (question !== undefined && (question.actors.length === 0 || question.actors.includes(user))) {
      try {
        const answered = await options.ingress.answerInput({ runId: question.runId, actor: { id: user }, text, messageId: ts });
        state.setQuestion(conversationId, undefined);
        return emit({ type: "answered", conversationId, messageId: ts, runId: answered.runId });
      } catch (error) {
        const code = ConnectError.from(error).code;
        if (code !== Code.FailedPrecondition && code !== Code.NotFound) throw error;
        // The run stopped waiting (answered elsewhere, cancelled): the reply is an ordinary message.
        state.setQuestion(conversationId, undefined);
      }
    }
    const submitted = await options.ingress.submitMessage({
      agentId: options.agentId,
      conversationId,
      actor: { id: user },
      messageId: ts,
      text,
      connector: options.connector,
    });
    emit({ type: "submitted", conversationId, messageId: ts, runId: submitted.runId, detail: submitted.duplicate ? "duplicate" : "" });
  }

  async function onEdit(event: SlackMessage): Promise<void> {
    const edited = event.message;
    const channel = event.channel;
    if (edited === undefined || channel === undefined || edited.ts === undefined || edited.user === undefined || fromBot(edited)) return emit({ type: "ignored", detail: "not a person's edit" });
    // Slack also reports unfurls and thread bookkeeping as message_changed; only new text is an edit.
    if (edited.text === event.previous_message?.text) return emit({ type: "ignored", detail: "text unchanged" });
    const conversationId = `${channel}:${edited.thread_ts ?? edited.ts}`;
    if (!state.knowsThread(conversationId)) return emit({ type: "ignored", conversationId, detail: "not in a thread of ours" });
    const text = textOf(edited);
    if (text === "") return emit({ type: "ignored", conversationId, detail: "empty" });
    try {
      const response = await options.ingress.editMessage({ agentId: options.agentId, conversationId, messageId: edited.ts, actor: { id: edited.user }, text });
      emit({ type: "edited", conversationId, messageId: edited.ts, runId: response.runId });
    } catch (error) {
      // An edit of a message Keel never had (it predates the bot, or was an answer) changes nothing.
      if (ConnectError.from(error).code !== Code.NotFound) throw error;
      emit({ type: "ignored", conversationId, messageId: edited.ts, detail: "edit of a message Keel does not know" });
    }
  }

  return { handle };
}
