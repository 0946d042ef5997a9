import { randomUUID } from "node:crypto";
import { AckState, DeliveryStatus, EmissionKind, EmissionService } from "../../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { connect, type ClientOptions } from "./client.js";

export interface SendOptions {
  readonly agent: string;
  readonly conversation: string;
  readonly actor: string;
  readonly text: string;
  readonly timeoutMs: number;
}

/**
 * Submits a message and prints the reply. Each invocation listens on a connector of
 * its own, so the stream it reads holds only this message's emissions.
 */
export async function sendCommand(client: ClientOptions, options: SendOptions, out: (line: string) => void): Promise<number> {
  const connector = `cli-${randomUUID().slice(0, 8)}`;
  const ingress = connect(IngressService, client);
  const emissions = connect(EmissionService, client);
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), options.timeoutMs);
  try {
    const submitted = await ingress.submitMessage({
      agentId: options.agent,
      conversationId: options.conversation,
      actor: { id: options.actor },
      messageId: `cli-${randomUUID()}`,
      text: options.text,
      connector,
    });
    out(`run ${submitted.runId} queued`);
    for await (const { emission } of emissions.subscribe({ connector }, { signal: abort.signal })) {
      if (emission === undefined) continue;
      if (emission.kind === EmissionKind.REPLY || emission.kind === EmissionKind.QUESTION) {
        out(emission.text);
        await emissions.acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED, remoteRef: "stdout" });
      }
      if (emission.kind === EmissionKind.ACK && (emission.ackState === AckState.SUCCEEDED || emission.ackState === AckState.FAILED)) {
        return emission.ackState === AckState.SUCCEEDED ? 0 : 1;
      }
    }
    return 1;
  } catch (error) {
    if (abort.signal.aborted) {
      out(`no reply within ${options.timeoutMs} ms; the run goes on: see \`keel runs\``);
      return 1;
    }
    throw error;
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
}
