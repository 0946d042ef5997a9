// The Subscribe bench's clients, in a process of their own as connectors would be: opens the
// streams it is told to, records what each receives, and on request checks every stream got
// exactly the emissions expected for its connector, in order, since the last check that passed.
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { EmissionService } from "../../gen/keel/v1/emission_service_pb.js";

export interface OpenRequest {
  readonly kind: "open";
  readonly url: string;
  readonly tokens: readonly string[];
  readonly connectors: readonly string[];
  readonly streams: number;
  readonly afterSeq: string;
  readonly streamsPerSession: number;
  /** Streams one token may hold (the server's cap); sessions take tokens in order so none holds more. */
  readonly streamsPerToken: number;
}
export interface CheckRequest {
  readonly kind: "check";
  /** Per connector, the texts every stream of it must have received, in order. */
  readonly expected: Readonly<Record<string, readonly string[]>>;
  readonly timeoutMs: number;
}
export type ChildReply =
  | { readonly kind: "opened" }
  /** `cpuUs`: this process's CPU time since the streams were opened or the last check passed. */
  | { readonly kind: "checked"; readonly error?: string; readonly cpuUs: number }
  | { readonly kind: "closed" };

const received: { connector: string; texts: string[] }[] = [];
const stops: AbortController[] = [];
const failures: string[] = [];
const reply = (message: ChildReply): void => void process.send?.(message);
let cpuAtOpen = process.cpuUsage();
const cpuSinceOpen = (): number => {
  const used = process.cpuUsage(cpuAtOpen);
  return used.user + used.system;
};

function open(request: OpenRequest): void {
  const sessions = Math.ceil(request.streams / request.streamsPerSession);
  const clients = Array.from({ length: sessions }, (_, i) => {
    const token = request.tokens[Math.floor((i * request.streamsPerSession) / request.streamsPerToken)] ?? "";
    const bearer: Interceptor = (next) => (call) => {
      call.header.set("authorization", `Bearer ${token}`);
      return next(call);
    };
    return createClient(EmissionService, createConnectTransport({ baseUrl: request.url, httpVersion: "2", interceptors: [bearer] }));
  });
  for (let i = 0; i < request.streams; i++) {
    const client = clients[Math.floor(i / request.streamsPerSession)];
    const connector = request.connectors[i % request.connectors.length] ?? "";
    const stop = new AbortController();
    const texts: string[] = [];
    stops.push(stop);
    received.push({ connector, texts });
    void (async () => {
      try {
        for await (const { emission } of client!.subscribe({ connector, afterSeq: BigInt(request.afterSeq) }, { signal: stop.signal })) {
          if (emission !== undefined) texts.push(emission.text);
        }
      } catch (error) {
        if (!stop.signal.aborted) failures.push(String(error));
      }
    })();
  }
  cpuAtOpen = process.cpuUsage();
  reply({ kind: "opened" });
}

async function check(request: CheckRequest): Promise<void> {
  const deadline = Date.now() + request.timeoutMs;
  const want = (connector: string) => request.expected[connector] ?? [];
  for (;;) {
    if (failures.length > 0) return reply({ kind: "checked", error: `${failures.length} streams failed, e.g. ${failures[0]}`, cpuUs: cpuSinceOpen() });
    const short = received.filter((r) => r.texts.length < want(r.connector).length);
    if (short.length === 0) break;
    if (Date.now() > deadline) {
      return reply({ kind: "checked", error: `${short.length} of ${received.length} streams are missing emissions after ${request.timeoutMs} ms`, cpuUs: cpuSinceOpen() });
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const wrong = received.filter((r) => r.texts.join("\n") !== want(r.connector).join("\n"));
  const cpuUs = cpuSinceOpen();
  if (wrong.length > 0) return reply({ kind: "checked", error: `${wrong.length} streams received emissions out of order or twice`, cpuUs });
  // The next check is of what arrives from now on, and so is its CPU time.
  for (const stream of received) stream.texts.length = 0;
  cpuAtOpen = process.cpuUsage();
  reply({ kind: "checked", cpuUs });
}

process.on("message", (message: OpenRequest | CheckRequest | { kind: "close" }) => {
  if (message.kind === "open") open(message);
  else if (message.kind === "check") void check(message);
  else {
    for (const stop of stops) stop.abort();
    reply({ kind: "closed" });
    setTimeout(() => process.exit(0), 100);
  }
});
