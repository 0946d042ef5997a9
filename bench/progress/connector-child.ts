// The progress bench's connector, in a process of its own as a connector would be: one Subscribe
// stream from the start of its connector's emissions, each PENDING one acknowledged DELIVERED,
// one per AcknowledgeEmission call or batched into AcknowledgeEmissions calls of what has
// arrived meanwhile, with a bounded number of calls in flight. It reports each time the count of progress
// notices received or acknowledged reaches a multiple of the run count.
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DeliveryStatus, EmissionKind, EmissionService } from "../../gen/keel/v1/emission_service_pb.js";

export interface ConnectorStart {
  readonly kind: "start";
  readonly url: string;
  readonly token: string;
  readonly connector: string;
  /** Reports come at every multiple of this many progress notices. */
  readonly runs: number;
  /** Acknowledgement calls in flight at most. */
  readonly ackWindow: number;
  /** Emissions per call at most: 1 sends AcknowledgeEmission per emission, more AcknowledgeEmissions. */
  readonly ackBatch: number;
}
export type ConnectorReport =
  /** Sent once the process has loaded and waits for its start. */
  | { readonly kind: "ready" }
  | { readonly kind: "received" | "acknowledged"; readonly count: number }
  /** `cpuUs`: this process's CPU time since the stream opened. */
  | { readonly kind: "stopped"; readonly error?: string | undefined; readonly cpuUs: number };

const report = (message: ConnectorReport): void => void process.send?.(message);
const stop = new AbortController();
/** Set when the parent asks the connector to stop; the aborted stream's error is then expected. */
let stopRequested = false;

async function connect(start: ConnectorStart): Promise<void> {
  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${start.token}`);
    return next(request);
  };
  const emissions = createClient(EmissionService, createGrpcTransport({ baseUrl: start.url, interceptors: [bearer] }));
  let received = 0;
  let acknowledged = 0;
  /** Delivered, not yet acknowledged: [emission id, is a progress notice]. */
  let unacknowledged: [string, boolean][] = [];
  const calls = new Set<Promise<unknown>>();
  let failure: Error | undefined;
  const acknowledge = (batch: [string, boolean][]): Promise<unknown> => {
    const settled = (): void => {
      for (const [, isNotice] of batch) if (isNotice && ++acknowledged % start.runs === 0) report({ kind: "acknowledged", count: acknowledged });
    };
    const outcome = DeliveryStatus.DELIVERED;
    if (start.ackBatch === 1) return emissions.acknowledgeEmission({ emissionId: batch[0]![0], outcome }).then(settled);
    return emissions.acknowledgeEmissions({ acknowledgements: batch.map(([emissionId]) => ({ emissionId, outcome })) }).then(settled);
  };
  /** Sends what waits, in calls of at most ackBatch, while fewer than ackWindow calls are in flight. */
  const flush = (): void => {
    while (unacknowledged.length > 0 && calls.size < start.ackWindow) {
      const batch = unacknowledged.slice(0, start.ackBatch);
      unacknowledged = unacknowledged.slice(batch.length);
      const call: Promise<unknown> = acknowledge(batch)
        .catch((error: unknown) => {
          failure ??= error instanceof Error ? error : new Error(String(error));
          stop.abort();
        })
        .finally(() => {
          calls.delete(call);
          flush();
        });
      calls.add(call);
    }
  };
  try {
    for await (const { emission } of emissions.subscribe({ connector: start.connector, afterSeq: 0n }, { signal: stop.signal })) {
      if (emission === undefined || emission.deliveryStatus !== DeliveryStatus.PENDING) continue;
      const isNotice = emission.kind === EmissionKind.PROGRESS;
      if (isNotice && ++received % start.runs === 0) report({ kind: "received", count: received });
      // Bounded: past a window's worth waiting, the stream is read no further until acks catch up.
      while (unacknowledged.length >= start.ackWindow * start.ackBatch) await Promise.race(calls);
      unacknowledged.push([emission.id, isNotice]);
      flush();
    }
  } catch (error) {
    throw failure ?? error;
  }
  // A failed acknowledgement aborts the stream, which may end it without an error.
  if (failure !== undefined) throw failure;
}

let cpuAtStart = process.cpuUsage();
process.on("message", (message: ConnectorStart | { kind: "stop" }) => {
  if (message.kind === "stop") {
    stopRequested = true;
    stop.abort();
    return;
  }
  cpuAtStart = process.cpuUsage();
  connect(message).then(
    () => finish(),
    (error: unknown) => finish(stopRequested ? undefined : String(error)),
  );
});

report({ kind: "ready" });

function finish(error?: string): void {
  const used = process.cpuUsage(cpuAtStart);
  report({ kind: "stopped", error, cpuUs: used.user + used.system });
  process.disconnect?.();
}
