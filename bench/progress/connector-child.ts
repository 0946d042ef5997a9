// The progress bench's connector, in a process of its own as a connector would be: one Subscribe
// stream from the start of its connector's emissions, each PENDING one acknowledged DELIVERED
// with a bounded number of acknowledgements in flight. It reports each time the count of progress
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
  readonly ackWindow: number;
}
export type ConnectorReport =
  /** Sent once the process has loaded and waits for its start. */
  | { readonly kind: "ready" }
  | { readonly kind: "received" | "acknowledged"; readonly count: number }
  /** `cpuUs`: this process's CPU time since the stream opened. */
  | { readonly kind: "stopped"; readonly error?: string | undefined; readonly cpuUs: number };

const report = (message: ConnectorReport): void => void process.send?.(message);
const stop = new AbortController();

async function connect(start: ConnectorStart): Promise<void> {
  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${start.token}`);
    return next(request);
  };
  const emissions = createClient(EmissionService, createGrpcTransport({ baseUrl: start.url, interceptors: [bearer] }));
  let received = 0;
  let acknowledged = 0;
  const acking = new Set<Promise<unknown>>();
  for await (const { emission } of emissions.subscribe({ connector: start.connector, afterSeq: 0n }, { signal: stop.signal })) {
    if (emission === undefined || emission.deliveryStatus !== DeliveryStatus.PENDING) continue;
    const isNotice = emission.kind === EmissionKind.PROGRESS;
    if (isNotice && ++received % start.runs === 0) report({ kind: "received", count: received });
    while (acking.size >= start.ackWindow) await Promise.race(acking);
    const ack: Promise<unknown> = emissions
      .acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED })
      .then(() => {
        if (isNotice && ++acknowledged % start.runs === 0) report({ kind: "acknowledged", count: acknowledged });
      })
      .finally(() => acking.delete(ack));
    acking.add(ack);
  }
}

let cpuAtStart = process.cpuUsage();
process.on("message", (message: ConnectorStart | { kind: "stop" }) => {
  if (message.kind === "stop") {
    stop.abort();
    return;
  }
  cpuAtStart = process.cpuUsage();
  connect(message).then(
    () => finish(),
    (error: unknown) => finish(stop.signal.aborted ? undefined : String(error)),
  );
});

report({ kind: "ready" });

function finish(error?: string): void {
  const used = process.cpuUsage(cpuAtStart);
  report({ kind: "stopped", error, cpuUs: used.user + used.system });
  process.disconnect?.();
}
