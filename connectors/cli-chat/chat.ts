// An interactive chat with one agent in one conversation: each line is a message, and what Keel
// emits for it (acks, progress, questions, replies) is printed as it arrives. While a question is
// open, the next line answers it (AnswerInput) instead of starting a new message.
import { randomUUID } from "node:crypto";
import { createInterface } from "node:readline";
import { ConnectError } from "@connectrpc/connect";
import { AckState, DeliveryStatus, EmissionKind, type Emission } from "../../gen/keel/v1/emission_service_pb.js";
import { ackStateName, awaitsDelivery, kindName, type KeelClients } from "../shared/keel-client.js";

export interface ChatOptions {
  readonly clients: KeelClients;
  readonly agent: string;
  readonly conversation: string;
  readonly actor: string;
  /** This session's connector name: the stream its emissions arrive on. */
  readonly connector: string;
  readonly input: NodeJS.ReadableStream;
  readonly output: NodeJS.WritableStream;
  readonly terminal: boolean;
}

const ACK_MARKS: Partial<Record<AckState, string>> = {
  [AckState.WORKING]: "⏳",
  [AckState.STARTED]: "👀",
  [AckState.THINKING]: "🧠",
  [AckState.SUCCEEDED]: "✅",
  [AckState.FAILED]: "❌",
};

/** One line for an emission; kinds and ack states this build does not know are shown by name or number. */
export function renderEmission(emission: Emission): string {
  const run = emission.runId.slice(0, 8);
  switch (emission.kind) {
    case EmissionKind.ACK:
      return `${ACK_MARKS[emission.ackState] ?? "•"} ${ackStateName(emission.ackState)} (run ${run})`;
    case EmissionKind.REPLY:
      return `keel: ${emission.text}`;
    case EmissionKind.QUESTION:
      return `❓ ${emission.text}\n   (your next line answers it)`;
    case EmissionKind.PROGRESS:
      return `… ${emission.text}`;
    default:
      return `[${kindName(emission.kind)}${emission.ackState === AckState.UNSPECIFIED ? "" : ` ${ackStateName(emission.ackState)}`}] ${emission.text}`;
  }
}

/** Runs until /quit or end of input; resolves with the exit code. */
export async function runChat(options: ChatOptions): Promise<number> {
  const { clients } = options;
  const abort = new AbortController();
  const rl = createInterface({ input: options.input, output: options.output, terminal: options.terminal, prompt: "> " });
  // Printed above the prompt line, which is redrawn with whatever was being typed.
  const print = (text: string) => {
    options.output.write(options.terminal ? `\r\x1b[K${text}\n` : `${text}\n`);
    rl.prompt(true);
  };
  let openQuestion: Emission | undefined;

  const listening = (async () => {
    let afterSeq = 0n;
    let failures = 0;
    while (!abort.signal.aborted) {
      try {
        for await (const { emission } of clients.emissions.subscribe({ connector: options.connector, afterSeq }, { signal: abort.signal })) {
          failures = 0;
          if (emission === undefined) continue;
          afterSeq = emission.seq;
          if (!awaitsDelivery(emission)) continue;
          if (emission.kind === EmissionKind.QUESTION) openQuestion = emission;
          print(renderEmission(emission));
          await clients.emissions.acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED, remoteRef: "terminal" });
        }
      } catch (error) {
        if (abort.signal.aborted) return;
        print(`(stream interrupted: ${ConnectError.from(error).rawMessage}; reconnecting)`);
        await new Promise((resolve) => setTimeout(resolve, Math.min(5_000, 200 * 2 ** failures++)));
      }
    }
  })();

  print(`chatting with ${options.agent} in ${options.conversation} as ${options.actor}; /quit to leave`);
  try {
    for await (const line of rl) {
      const text = line.trim();
      if (text === "/quit") break;
      if (text === "") {
        rl.prompt();
        continue;
      }
      try {
        if (openQuestion !== undefined) {
          const question = openQuestion;
          openQuestion = undefined;
          await clients.ingress.answerInput({ runId: question.runId, actor: { id: options.actor }, text, messageId: `cli-chat-${randomUUID()}` });
          print(`(answered run ${question.runId.slice(0, 8)})`);
        } else {
          await clients.ingress.submitMessage({
            agentId: options.agent,
            conversationId: options.conversation,
            actor: { id: options.actor },
            messageId: `cli-chat-${randomUUID()}`,
            text,
            connector: options.connector,
          });
          rl.prompt();
        }
      } catch (error) {
        print(`(not sent: ${ConnectError.from(error).rawMessage})`);
      }
    }
  } finally {
    abort.abort();
    rl.close();
    await listening;
  }
  return 0;
}
