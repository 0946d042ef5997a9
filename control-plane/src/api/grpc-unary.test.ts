import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createContextValues, createServiceImplSpec, type Interceptor, type ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { afterEach, describe, expect, it } from "vitest";
import { IngressService, SubmitMessageRequestSchema, SubmitMessageResponseSchema } from "../../../gen/keel/v1/ingress_service_pb.js";
import { grpcJsClient } from "../../../test/support/clients.js";
import { grpcUnary } from "./grpc-unary.js";

const MAX_BYTES = 64 * 1024;

/** What the implementation does with each message: its text says which case this is. */
const ingress: Partial<ServiceImpl<typeof IngressService>> = {
  async submitMessage(request, context) {
    if (request.text === "refuse") throw new ConnectError("no such agent", Code.NotFound, { "x-why": "missing" });
    if (request.text === "crash") throw new Error("secret detail");
    if (request.text === "wait") {
      await new Promise((resolve) => context.signal.addEventListener("abort", resolve, { once: true }));
      throw new ConnectError("gave up", Code.DeadlineExceeded);
    }
    if (request.text === "huge") return { runId: "r".repeat(MAX_BYTES + 1) };
    context.responseHeader.set("x-served-by", "impl");
    return { runId: `run for ${request.text} from ${context.requestHeader.get("x-caller") ?? "nobody"}` };
  },
};

/** Adds a trailer to every call and counts the calls it saw: the interceptors run on the lean path too. */
let intercepted = 0;
const marker: Interceptor = (next) => async (request) => {
  intercepted++;
  const response = await next(request);
  response.trailer.set("x-intercepted", "yes");
  return response;
};

let server: http2.Http2Server | undefined;
const sessions = new Set<http2.ServerHttp2Session>();
afterEach(async () => {
  // Clients keep their connections for reuse: close() would wait for them.
  for (const session of sessions) session.destroy();
  sessions.clear();
  await new Promise<void>((resolve) => (server === undefined ? resolve() : server.close(() => resolve())));
  server = undefined;
});

/** A server whose lean path serves IngressService; `next` counts what it passes on, then connect serves it. */
async function serve(): Promise<{ url: string; passedOn: () => number }> {
  const interceptors = [marker];
  const connect = connectNodeAdapter({ routes: (router) => router.service(IngressService, ingress), interceptors, readMaxBytes: MAX_BYTES, writeMaxBytes: MAX_BYTES });
  let passed = 0;
  const handler = grpcUnary(
    [createServiceImplSpec<typeof IngressService>(IngressService, ingress)],
    { interceptors, readMaxBytes: MAX_BYTES, writeMaxBytes: MAX_BYTES, maxTimeoutMs: 10_000, shutdownSignal: new AbortController().signal, contextValues: () => createContextValues() },
    (request, response) => {
      passed++;
      connect(request, response);
    },
  );
  const started = http2.createServer(handler);
  started.on("session", (session: http2.ServerHttp2Session) => sessions.add(session));
  server = started;
  await new Promise<void>((resolve) => started.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(started.address() as AddressInfo).port}`, passedOn: () => passed };
}

/** One raw gRPC call with the given body bytes: the status, message and whether the stream ended. */
function rawCall(url: string, body: Buffer): Promise<{ status: string | undefined; message: string | undefined }> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    const stream = session.request({ ":method": "POST", ":path": "/keel.v1.IngressService/SubmitMessage", "content-type": "application/grpc", te: "trailers" });
    let headers: http2.IncomingHttpHeaders = {};
    stream.on("response", (h: http2.IncomingHttpHeaders) => (headers = h));
    stream.on("trailers", (h: http2.IncomingHttpHeaders) => (headers = { ...headers, ...h }));
    stream.on("data", () => {});
    stream.on("error", () => {});
    stream.on("close", () => {
      session.close();
      resolve({ status: headers["grpc-status"] as string | undefined, message: headers["grpc-message"] as string | undefined });
    });
    stream.on("error", reject);
    stream.end(body);
  });
}

function envelope(message: Uint8Array, declaredLength = message.length): Buffer {
  const frame = Buffer.alloc(5 + message.length);
  frame.writeUInt32BE(declaredLength, 1);
  frame.set(message, 5);
  return frame;
}

describe("unary gRPC calls served without connect's pipeline", () => {
  it("answers a grpc-js call with the implementation's message, its headers, and the interceptors' trailers", async () => {
    const { url, passedOn } = await serve();
    const client = await grpcJsClient(url, "ingress_service.proto", "IngressService");
    const metadata = new grpc.Metadata();
    metadata.set("x-caller", "grpc-js");
    const before = intercepted;
    const seen: { header?: grpc.Metadata; trailer?: grpc.Metadata } = {};
    const reply = await new Promise<{ run_id: string }>((resolve, reject) => {
      const call = client.makeUnaryRequest(
        "/keel.v1.IngressService/SubmitMessage",
        (value: Record<string, unknown>) => Buffer.from(toBinary(SubmitMessageRequestSchema, create(SubmitMessageRequestSchema, value))),
        (bytes: Buffer) => ({ run_id: fromBinary(SubmitMessageResponseSchema, bytes).runId }),
        { text: "hello" },
        metadata,
        (error, value) => (error ? reject(error) : resolve(value as { run_id: string })),
      );
      call.on("metadata", (header) => (seen.header = header));
      call.on("status", (status) => (seen.trailer = status.metadata));
    });
    client.close();
    expect(reply.run_id).toBe("run for hello from grpc-js");
    expect(seen.header?.get("x-served-by")).toEqual(["impl"]);
    expect(seen.trailer?.get("x-intercepted")).toEqual(["yes"]);
    expect(intercepted).toBe(before + 1);
    expect(passedOn()).toBe(0);
  });

  it("gives connect's gRPC client the same errors connect would: code, message, metadata", async () => {
    const { url, passedOn } = await serve();
    const client = createClient(IngressService, createGrpcTransport({ baseUrl: url }));
    const refused = await client.submitMessage({ text: "refuse" }).catch((error: unknown) => ConnectError.from(error));
    expect(refused).toMatchObject({ code: Code.NotFound, rawMessage: "no such agent" });
    expect((refused as ConnectError).metadata.get("x-why")).toBe("missing");
    const crashed = await client.submitMessage({ text: "crash" }).catch((error: unknown) => ConnectError.from(error));
    expect(crashed).toMatchObject({ code: Code.Internal, rawMessage: "internal error" });
    const late = await client.submitMessage({ text: "wait" }, { timeoutMs: 50 }).catch((error: unknown) => ConnectError.from(error));
    expect(late).toMatchObject({ code: Code.DeadlineExceeded });
    const huge = await client.submitMessage({ text: "huge" }).catch((error: unknown) => ConnectError.from(error));
    expect(huge).toMatchObject({ code: Code.ResourceExhausted });
    expect(passedOn()).toBe(0);
  });

  it("refuses an oversized, truncated, or doubled body with the code that names it, and keeps serving", async () => {
    const { url } = await serve();
    const message = toBinary(SubmitMessageRequestSchema, create(SubmitMessageRequestSchema, { text: "hello" }));
    const oversized = await rawCall(url, envelope(new Uint8Array(MAX_BYTES + 1)));
    expect(oversized.status).toBe(String(Code.ResourceExhausted));
    expect(decodeURIComponent(oversized.message ?? "")).toContain(`readMaxBytes ${MAX_BYTES}`);
    expect((await rawCall(url, envelope(message, message.length + 10))).status).toBe(String(Code.InvalidArgument));
    expect((await rawCall(url, Buffer.concat([envelope(message), envelope(message)]))).status).toBe(String(Code.Unimplemented));
    expect((await rawCall(url, Buffer.alloc(0))).status).toBe(String(Code.Unimplemented));
    expect((await rawCall(url, envelope(Buffer.from([0xff, 0xff, 0xff])))).status).toBe(String(Code.Internal));
    expect(await rawCall(url, envelope(message))).toMatchObject({ status: "0" });
  });

  it("gives up on a body that never ends once the call's deadline passes", async () => {
    const { url } = await serve();
    const session = http2.connect(url);
    const stream = session.request({ ":method": "POST", ":path": "/keel.v1.IngressService/SubmitMessage", "content-type": "application/grpc", "grpc-timeout": "100m" });
    const status = new Promise<string | undefined>((resolve) => {
      stream.on("trailers", (trailers: http2.IncomingHttpHeaders) => resolve(trailers["grpc-status"] as string | undefined));
      stream.on("close", () => resolve(undefined));
    });
    stream.on("data", () => {});
    stream.on("error", () => {});
    stream.write(envelope(new Uint8Array(10), 100));
    expect(await status).toBe(String(Code.DeadlineExceeded));
    session.destroy();
  });

  it("leaves JSON, Connect and compressed calls to connect", async () => {
    const { url, passedOn } = await serve();
    const connectJson = createClient(IngressService, createConnectTransport({ baseUrl: url, httpVersion: "2", useBinaryFormat: false }));
    expect((await connectJson.submitMessage({ text: "json" })).runId).toBe("run for json from nobody");
    const compressed = createClient(IngressService, createGrpcTransport({ baseUrl: url, sendCompression: (await import("@connectrpc/connect-node")).compressionGzip, compressMinBytes: 0 }));
    expect((await compressed.submitMessage({ text: "gzip" })).runId).toBe("run for gzip from nobody");
    expect(passedOn()).toBe(2);
  });
});
