// Keel → Slack: each emission for our connector becomes Slack calls, and its outcome is reported
// with AcknowledgeEmission. Acks are reactions on the message (the previous one removed); progress
// notices, questions and replies are posted in the thread. A post that may have reached Slack is
// never made again: it is reported AMBIGUOUS, also after a crash or a rewound cursor.
import { ConnectError } from "@connectrpc/connect";
import type { WebClient } from "@slack/web-api";
import { AckState, DeliveryStatus, EmissionKind, type Emission } from "../../gen/keel/v1/emission_service_pb.js";
import { awaitsDelivery, kindName, type KeelClients } from "../shared/keel-client.js";
import { callSlack, type CallOutcome } from "./slack-call.js";
import type { Settlement, StateStore } from "./state.js";

/** The reaction each ack state shows; a state this build does not know shows nothing new. */
export const ACK_REACTIONS: Partial<Record<AckState, string>> = {
  [AckState.WORKING]: "hourglass_flowing_sand",
  [AckState.STARTED]: "eyes",
  [AckState.THINKING]: "brain",
  [AckState.SUCCEEDED]: "white_check_mark",
  [AckState.FAILED]: "x",
};

export interface OutboundOptions {
  readonly emissions: KeelClients["emissions"];
  readonly web: WebClient;
  readonly connector: string;
  readonly state: StateStore;
  /** Attempts while a call provably never reached Slack; then the emission is FAILED. */
  readonly maxAttempts?: number;
  readonly backoffMs?: number;
  readonly onEvent?: (event: OutboundEvent) => void;
}

export type OutboundEvent =
  | { readonly type: "settled"; readonly emissionId: string; readonly seq: number; readonly kind: string; readonly status: Settlement["status"]; readonly detail: string }
  | { readonly type: "skipped"; readonly emissionId: string; readonly seq: number }
  | { readonly type: "stream-error"; readonly message: string };

const STATUS: Record<Settlement["status"], DeliveryStatus> = {
  delivered: DeliveryStatus.DELIVERED,
  failed: DeliveryStatus.FAILED,
  ambiguous: DeliveryStatus.AMBIGUOUS,
};

/** `channel:thread_ts` → its parts (a conversation another connector named has no thread). */
export function threadOf(conversationId: string): { channel: string; threadTs: string | undefined } {
  const at = conversationId.indexOf(":");
  return at < 0 ? { channel: conversationId, threadTs: undefined } : { channel: conversationId.slice(0, at), threadTs: conversationId.slice(at + 1) };
}

/** Runs until `signal` aborts, resubscribing from the stored cursor after a stream error. */
export async function runOutbound(options: OutboundOptions, signal: AbortSignal): Promise<void> {
  const { state } = options;
  const emit = options.onEvent ?? (() => undefined);
  let streamFailures = 0;
  while (!signal.aborted) {
    try {
      const inFlight = state.current.inFlight;
      // An interrupted reaction is made again when the stream offers it anew; a post is settled AMBIGUOUS.
      if (inFlight !== null && inFlight.outcome === undefined && inFlight.repeatable) state.update(() => ({ inFlight: null }));
      await settleInFlight("");
      for await (const { emission } of options.emissions.subscribe({ connector: options.connector, afterSeq: BigInt(state.current.afterSeq) }, { signal })) {
        streamFailures = 0;
        if (emission === undefined) continue;
        const seq = Number(emission.seq);
        if (seq <= state.current.afterSeq) continue;
        if (!awaitsDelivery(emission)) {
          emit({ type: "skipped", emissionId: emission.id, seq });
          state.update(() => ({ afterSeq: seq }));
          continue;
        }
        state.update(() => ({ inFlight: { emissionId: emission.id, seq, repeatable: emission.kind === EmissionKind.ACK } }));
        const outcome = await deliver(emission);
        if (outcome === undefined) {
          // Stopped while the call had never left: it stays pending for the next start.
          state.update(() => ({ inFlight: null }));
          break;
        }
        state.update((current) => ({ inFlight: { ...(current.inFlight ?? { emissionId: emission.id, seq, repeatable: false }), outcome } }));
        if (emission.kind === EmissionKind.ACK && (emission.ackState === AckState.SUCCEEDED || emission.ackState === AckState.FAILED)) state.clearQuestionsOf(emission.runId);
        await settleInFlight(kindName(emission.kind));
      }
    } catch (error) {
      if (signal.aborted) break;
      emit({ type: "stream-error", message: ConnectError.from(error).message });
      await delay(Math.min(5_000, (options.backoffMs ?? 200) * 2 ** Math.min(streamFailures++, 5)), signal);
    }
  }

  /** Reports the in-flight emission's outcome (AMBIGUOUS when we stopped before knowing it) and moves the cursor past it. */
  async function settleInFlight(kind: string): Promise<void> {
    const inFlight = state.current.inFlight;
    if (inFlight === null) return;
    const outcome = inFlight.outcome ?? { status: "ambiguous", remoteRef: "", detail: "the connector stopped after it may have posted this emission" };
    await options.emissions.acknowledgeEmission({ emissionId: inFlight.emissionId, outcome: STATUS[outcome.status], remoteRef: outcome.remoteRef, detail: outcome.detail });
    emit({ type: "settled", emissionId: inFlight.emissionId, seq: inFlight.seq, kind, status: outcome.status, detail: outcome.detail });
    state.update((current) => ({ afterSeq: Math.max(current.afterSeq, inFlight.seq), inFlight: null }));
  }

  /** Calls `method`, again only while it provably never reached Slack; undefined when stopped meanwhile. */
  async function call(method: string, args: Record<string, unknown>): Promise<CallOutcome | undefined> {
    const maxAttempts = options.maxAttempts ?? 6;
    for (let attempt = 1; ; attempt++) {
      const outcome = await callSlack(options.web, method, args);
      if (outcome.kind !== "not-sent" || attempt >= maxAttempts) return outcome;
      await delay(Math.max(outcome.retryAfterMs, Math.min(5_000, (options.backoffMs ?? 200) * 2 ** (attempt - 1))), signal);
      if (signal.aborted) return undefined;
    }
  }

  async function deliver(emission: Emission): Promise<Settlement | undefined> {
    const { channel, threadTs } = threadOf(emission.conversationId);
    if (emission.kind === EmissionKind.ACK) return react(emission, channel);
    // Progress, questions, replies and kinds added later: a message in the thread.
    let text = emission.text;
    if (emission.kind === EmissionKind.QUESTION) {
      const mentions = emission.addressedActorIds.map((actor) => `<@${actor}>`).join(" ");
      if (mentions !== "") text = `${mentions} ${text}`;
      // Registered before the post, so an answer typed the moment it shows is already expected.
      state.setQuestion(emission.conversationId, { runId: emission.runId, actors: [...emission.addressedActorIds] });
    } else if (emission.kind === EmissionKind.PROGRESS) text = `_${text}_`;
    else if (emission.kind !== EmissionKind.REPLY) text = `[${kindName(emission.kind)}] ${text}`;
    const outcome = await call("chat.postMessage", { channel, text, ...(threadTs === undefined ? {} : { thread_ts: threadTs }) });
    if (outcome === undefined) return undefined;
    // A question nobody can have seen expects no answer; one that may have landed still does.
    if (emission.kind === EmissionKind.QUESTION && (outcome.kind === "refused" || outcome.kind === "not-sent")) state.setQuestion(emission.conversationId, undefined);
    switch (outcome.kind) {
      case "ok":
        state.addThread(emission.conversationId);
        return { status: "delivered", remoteRef: `${channel}:${String((outcome.result as { ts?: string }).ts ?? "")}`, detail: "" };
      case "refused":
        return { status: "failed", remoteRef: "", detail: `Slack refused the post: ${outcome.error}` };
      case "not-sent":
        return { status: "failed", remoteRef: "", detail: `never reached Slack: ${outcome.reason}` };
      case "ambiguous":
        return { status: "ambiguous", remoteRef: "", detail: `may have reached Slack: ${outcome.reason}` };
    }
  }

  /** Shows the ack's reaction on the message it answers, then takes the previous one away. */
  async function react(emission: Emission, channel: string): Promise<Settlement | undefined> {
    const name = ACK_REACTIONS[emission.ackState];
    if (name === undefined || emission.replyToMessageId === "") return { status: "delivered", remoteRef: "", detail: "nothing to show" };
    const messageKey = `${channel}:${emission.replyToMessageId}`;
    const previous = state.current.reactions[messageKey];
    if (previous === name) return { status: "delivered", remoteRef: messageKey, detail: "already shown" };
    const target = { channel, timestamp: emission.replyToMessageId };
    // Reactions are idempotent (already_reacted, no_reaction), so an unclear outcome is simply tried again.
    for (let attempt = 1; ; attempt++) {
      const added = await call("reactions.add", { ...target, name });
      if (added === undefined) return undefined;
      if (added.kind === "ok" || (added.kind === "refused" && added.error === "already_reacted")) break;
      if (added.kind === "refused" || attempt >= (options.maxAttempts ?? 6)) {
        return { status: "failed", remoteRef: messageKey, detail: `could not add :${name}:: ${added.kind === "refused" ? added.error : added.reason}` };
      }
    }
    state.setReaction(messageKey, name);
    if (previous !== undefined) {
      const removed = await call("reactions.remove", { ...target, name: previous });
      if (removed === undefined) return undefined;
      if (removed.kind !== "ok" && !(removed.kind === "refused" && removed.error === "no_reaction")) {
        return { status: "delivered", remoteRef: messageKey, detail: `:${previous}: stays: ${removed.kind === "refused" ? removed.error : removed.reason}` };
      }
    }
    return { status: "delivered", remoteRef: messageKey, detail: "" };
  }
}

function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}
