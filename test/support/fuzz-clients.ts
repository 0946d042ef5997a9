// The fuzzer's three ways onto the wire, each answering one Outcome per call:
//   - @grpc/grpc-js with the service paths and response types loaded from the .proto files, the
//     request written as raw bytes, so unknown fields, overrides and truncation reach the server;
//   - Connect-ES binary and Connect-ES JSON, sending the typed message (binary keeps $unknown).
// A response stream is read until its first message, its end, an error, or a short quiet spell.
import { readdir } from "node:fs/promises";
import path from "node:path";
import { toBinary, toJson, type DescMethod, type DescService, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type CallOptions } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

export interface Outcome {
  readonly code: number;
  readonly message: string;
}

/** One request: the typed messages (several for a client stream) and the raw bytes grpc-js sends for each. */
export interface WireRequest {
  readonly messages: readonly Message[];
  readonly raw: readonly Uint8Array[];
}

export interface FuzzClient {
  readonly name: string;
  /** Undefined when this client cannot even encode the request (its own serializer refuses). */
  call(method: DescMethod, request: WireRequest, token: string): Promise<Outcome | undefined>;
  close(): void;
}

const CALL_TIMEOUT_MS = 15_000;
/** How long a response stream that says nothing is kept open before we hang up (it did not fail). */
const QUIET_STREAM_MS = 150;

export async function grpcJsRawClient(address: string, protoRoot: string): Promise<FuzzClient> {
  const files = (await readdir(path.join(protoRoot, "keel/v1"))).filter((f) => f.endsWith(".proto")).map((f) => `keel/v1/${f}`);
  const definition = await protoLoader.load(files, { includeDirs: [protoRoot], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  const client = new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.max_receive_message_length": -1 });
  const identity = (b: Buffer): Buffer => b;
  return {
    name: "grpc-js raw binary",
    call(method, request, token) {
      const def = (definition[method.parent.typeName] as grpc.ServiceDefinition | undefined)?.[method.name];
      if (def === undefined) return Promise.resolve({ code: Code.Unimplemented, message: "not in the .proto files" });
      const metadata = new grpc.Metadata();
      metadata.set("authorization", `Bearer ${token}`);
      const options = { deadline: Date.now() + CALL_TIMEOUT_MS };
      const buffers = request.raw.map((r) => Buffer.from(r.buffer, r.byteOffset, r.byteLength));
      const fromError = (error: grpc.ServiceError): Outcome => ({ code: error.code, message: error.details });
      return new Promise<Outcome>((resolve) => {
        if (method.methodKind === "unary") {
          client.makeUnaryRequest(def.path, identity, def.responseDeserialize, buffers[0]!, metadata, options, (error) =>
            resolve(error !== null ? fromError(error) : { code: 0, message: "" }),
          );
          return;
        }
        if (method.methodKind === "client_streaming") {
          const call = client.makeClientStreamRequest(def.path, identity, def.responseDeserialize, metadata, options, (error) =>
            resolve(error !== null ? fromError(error) : { code: 0, message: "" }),
          );
          for (const b of buffers) call.write(b);
          call.end();
          return;
        }
        let call: grpc.ClientReadableStream<unknown>;
        if (method.methodKind === "server_streaming") {
          call = client.makeServerStreamRequest(def.path, identity, def.responseDeserialize, buffers[0]!, metadata, options);
        } else {
          const duplex = client.makeBidiStreamRequest(def.path, identity, def.responseDeserialize, metadata, options);
          for (const b of buffers) duplex.write(b);
          call = duplex; // left half-open, as a host keeps its Attach stream
        }
        let settled = false;
        const finish = (outcome: Outcome) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          resolve(outcome);
          call.cancel();
        };
        const timer = setTimeout(() => finish({ code: 0, message: "still open" }), QUIET_STREAM_MS);
        call.on("data", () => finish({ code: 0, message: "" }));
        call.on("error", (error: grpc.ServiceError) => finish(fromError(error)));
        call.on("end", () => finish({ code: 0, message: "" }));
      });
    },
    close: () => client.close(),
  };
}

type AnyRpc = (input: unknown, options: CallOptions) => unknown;

export function connectEsClient(baseUrl: string, binary: boolean): FuzzClient {
  // Its own HTTP/2 session, closed by close(): see the session-memory note in fuzz-rpc.test.ts.
  const sessionManager = new Http2SessionManager(baseUrl);
  const transport = createConnectTransport({ baseUrl, httpVersion: "2", useBinaryFormat: binary, sessionManager });
  const clients = new Map<DescService, Record<string, AnyRpc>>();
  const rpcOf = (method: DescMethod) => {
    let c = clients.get(method.parent);
    if (c === undefined) {
      c = createClient(method.parent, transport);
      clients.set(method.parent, c);
    }
    return c[method.localName]!;
  };
  return {
    name: binary ? "Connect-ES binary" : "Connect-ES JSON",
    async call(method, request, token) {
      // Our own serializer refusing a value is not the server's answer; such a run sends nothing here.
      try {
        for (const m of request.messages) {
          if (binary) toBinary(method.input, m);
          else JSON.stringify(toJson(method.input, m));
        }
      } catch {
        return undefined;
      }
      const abort = new AbortController();
      const options: CallOptions = { signal: abort.signal, timeoutMs: CALL_TIMEOUT_MS, headers: { authorization: `Bearer ${token}` } };
      const rpc = rpcOf(method);
      let timer: NodeJS.Timeout | undefined;
      try {
        switch (method.methodKind) {
          case "unary":
            await (rpc(request.messages[0], options) as Promise<Message>);
            return { code: 0, message: "" };
          case "client_streaming":
            await (rpc(createAsyncIterable([...request.messages]), options) as Promise<Message>);
            return { code: 0, message: "" };
          default: {
            const input = method.methodKind === "server_streaming" ? request.messages[0] : halfOpen(request.messages, abort.signal);
            const stream = (rpc(input, options) as AsyncIterable<Message>)[Symbol.asyncIterator]();
            const quiet = new Promise<"quiet">((resolve) => (timer = setTimeout(() => resolve("quiet"), QUIET_STREAM_MS)));
            const first = stream.next();
            first.catch(() => undefined); // after a quiet spell we hang up; that rejection is ours
            await Promise.race([first, quiet]);
            return { code: 0, message: "" };
          }
        }
      } catch (error) {
        const e = ConnectError.from(error);
        return { code: e.code, message: e.rawMessage };
      } finally {
        clearTimeout(timer);
        abort.abort();
      }
    },
    close: () => {
      clients.clear();
      sessionManager.abort();
    },
  };
}

/** The messages, then silence until the call ends: a host does not close its half of Attach. */
async function* halfOpen(messages: readonly Message[], signal: AbortSignal): AsyncIterable<Message> {
  yield* messages;
  await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}
