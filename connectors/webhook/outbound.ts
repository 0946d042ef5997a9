// HTTP out: each emission for our connector is POSTed to the peer, HMAC-signed, with the emission's
// idempotency key, and its outcome reported with AcknowledgeEmission. A POST is retried only while
// it provably never left (see http-post.ts); whatever may have reached the peer is sent at most once.
import { toJsonString } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { DeliveryStatus, EmissionSchema, type Emission } from "../../gen/keel/v1/emission_service_pb.js";
import { awaitsDelivery, type KeelClients } from "../shared/keel-client.js";
import { post, type PostOutcome } from "./http-post.js";
import { IDEMPOTENCY_HEADER, sign, SIGNATURE_HEADER, TIMESTAMP_HEADER } from "./signature.js";
import { loadState, saveState, type InFlight, type OutboundState } from "./state-file.js";

export interface OutboundOptions {
  readonly emissions: KeelClients["emissions"];
  readonly connector: string;
  readonly targetUrl: string;
  readonly secret: string;
  readonly stateFile: string;
  /** Per attempt: connect and response together. */
  readonly timeoutMs?: number;
  /** Attempts while the request never left; then the emission is FAILED. */
  readonly maxAttempts?: number;
  readonly backoffMs?: number;
  readonly onEvent?: (event: OutboundEvent) => void;
}

export type OutboundEvent =
  | { readonly type: "attempt"; readonly emissionId: string; readonly attempt: number; readonly outcome: PostOutcome }
  | { readonly type: "settled"; readonly emissionId: string; readonly seq: number; readonly status: Settlement["status"]; readonly detail: string }
  | { readonly type: "skipped"; readonly emissionId: string; readonly seq: number }
  | { readonly type: "stream-error"; readonly message: string };

type Settlement = NonNullable<InFlight["outcome"]>;

const STATUS: Record<Settlement["status"], DeliveryStatus> = {
  delivered: DeliveryStatus.DELIVERED,
  failed: DeliveryStatus.FAILED,
  ambiguous: DeliveryStatus.AMBIGUOUS,
};

/** Runs until `signal` aborts, resubscribing from the stored cursor after a stream error. */
export async function runOutbound(options: OutboundOptions, signal: AbortSignal): Promise<void> {
  const emit = options.onEvent ?? (() => undefined);
  let state = loadState(options.stateFile);
  const save = (next: OutboundState) => {
    state = next;
    saveState(options.stateFile, state);
  };
  let streamFailures = 0;
  while (!signal.aborted) {
    try {
      if (state.inFlight !== null) await settleInFlight(state.inFlight);
      for await (const { emission } of options.emissions.subscribe({ connector: options.connector, afterSeq: BigInt(state.afterSeq) }, { signal })) {
        streamFailures = 0;
        if (emission === undefined) continue;
        const seq = Number(emission.seq);
        if (awaitsDelivery(emission)) {
          save({ ...state, inFlight: { emissionId: emission.id, seq } });
          const outcome = await deliver(emission);
          if (outcome === undefined) {
            // Stopped while the POST had never left: it stays pending for the next start.
            save({ ...state, inFlight: null });
            break;
          }
          save({ ...state, inFlight: { emissionId: emission.id, seq, outcome } });
          await settleInFlight(state.inFlight as InFlight);
        } else {
          emit({ type: "skipped", emissionId: emission.id, seq });
          save({ ...state, afterSeq: seq });
        }
      }
    } catch (error) {
      if (signal.aborted) break;
      emit({ type: "stream-error", message: ConnectError.from(error).message });
      await delay(Math.min(5_000, (options.backoffMs ?? 200) * 2 ** Math.min(streamFailures++, 5)), signal);
    }
  }

  /** Reports the in-flight emission's outcome (AMBIGUOUS when we crashed before knowing it) and moves the cursor past it. */
  async function settleInFlight(inFlight: InFlight): Promise<void> {
    const outcome = inFlight.outcome ?? { status: "ambiguous", remoteRef: "", detail: "the connector stopped after it may have sent this emission" };
    await options.emissions.acknowledgeEmission({ emissionId: inFlight.emissionId, outcome: STATUS[outcome.status], remoteRef: outcome.remoteRef, detail: outcome.detail });
    emit({ type: "settled", emissionId: inFlight.emissionId, seq: inFlight.seq, status: outcome.status, detail: outcome.detail });
    save({ afterSeq: Math.max(state.afterSeq, inFlight.seq), inFlight: null });
  }

  async function deliver(emission: Emission): Promise<Settlement | undefined> {
    const body = toJsonString(EmissionSchema, emission, { useProtoFieldName: true, alwaysEmitImplicit: true });
    const url = new URL(options.targetUrl);
    const maxAttempts = options.maxAttempts ?? 6;
    for (let attempt = 1; ; attempt++) {
      const timestamp = String(Math.floor(Date.now() / 1000));
      const outcome = await post({
        url,
        body,
        timeoutMs: options.timeoutMs ?? 10_000,
        headers: { [SIGNATURE_HEADER]: sign(options.secret, timestamp, body), [TIMESTAMP_HEADER]: timestamp, [IDEMPOTENCY_HEADER]: emission.idempotencyKey || emission.id },
      });
      emit({ type: "attempt", emissionId: emission.id, attempt, outcome });
      if (outcome.kind === "response") return settlementOf(outcome.status, outcome.requestId);
      if (outcome.kind === "ambiguous") return { status: "ambiguous", remoteRef: "", detail: `may have reached the peer: ${outcome.reason}` };
      if (signal.aborted) return undefined;
      if (attempt >= maxAttempts) return { status: "failed", remoteRef: "", detail: `never reached the peer after ${attempt} attempts: ${outcome.reason}` };
      await delay(Math.min(5_000, (options.backoffMs ?? 200) * 2 ** (attempt - 1)), signal);
      if (signal.aborted) return undefined;
    }
  }
}

/**
 * 2xx delivered; 4xx the peer refused it; 5xx the peer got it and failed somewhere we cannot see,
 * so whether it acted is unknown (AMBIGUOUS, not re-sent); anything else (3xx) is not a delivery.
 */
export function settlementOf(status: number, requestId: string): Settlement {
  const remoteRef = requestId || `http-${status}`;
  if (status >= 200 && status < 300) return { status: "delivered", remoteRef, detail: "" };
  if (status >= 500) return { status: "ambiguous", remoteRef, detail: `the peer answered ${status}` };
  return { status: "failed", remoteRef, detail: `the peer answered ${status}` };
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
