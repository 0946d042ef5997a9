// Unary gRPC calls over HTTP/2, served without connect's per-call pipeline. Connect serves a unary
// call like a stream: the request body through a chain of async-iterable stages (split, parse,
// invoke, serialize, envelope, join) and the node adapter's conversion of both ends, with
// Headers objects and promises at each step. Measured on loopback, that cost about 0.6 ms of CPU
// per call above a plain HTTP/2 exchange, and a message's ingress paid it before admission began.
// Here a call whose headers show binary gRPC without compression is read in one buffer, run
// through the same interceptors and implementation (connect's invokeUnaryImplementation, so errors,
// auth, deadlines and context behave as they do under connect) and answered with one data frame
// and the trailers. Everything else (JSON, gRPC-Web, Connect, compressed requests, streams,
// HTTP/1.1) goes to connect as before.
import http2 from "node:http2";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createHandlerContext, type ContextValues, type Interceptor, type ServiceImplSpec } from "@connectrpc/connect";
import { invokeUnaryImplementation } from "@connectrpc/connect/protocol";
import { contentTypeProto, grpcStatusOk, parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { RequestHandler } from "./auth-gate.js";
import { resetSoon } from "./refusal.js";

/**
 * Why a call's signal aborts once it has answered: anything still listening stops. A reason given
 * spares building an AbortError, with its stack trace, on every call.
 */
const CALL_ENDED = new ConnectError("the call has ended", Code.Canceled);

type UnarySpec = Extract<ServiceImplSpec["methods"][string], { kind: "unary" }>;

export interface GrpcUnaryOptions {
  /** The same interceptors, in the same order, as connect's handler has. */
  readonly interceptors: readonly Interceptor[];
  readonly readMaxBytes: number;
  readonly writeMaxBytes: number;
  readonly maxTimeoutMs: number;
  readonly shutdownSignal: AbortSignal;
  /** The context values a call starts with, as connect's adapter is given them. */
  readonly contextValues: (request: http2.Http2ServerRequest) => ContextValues;
}

/** Binary gRPC, as connect's gRPC handler accepts it: application/grpc or application/grpc+proto. */
const BINARY_GRPC = /^application\/grpc(?:\+proto)?\s*(?:;|$)/i;
/** The envelope's prefix: a flag byte and the message length, big-endian. */
const PREFIX_BYTES = 5;

/**
 * A request handler that serves the unary methods of `services` itself when a call is binary gRPC
 * over HTTP/2 without request compression, and passes every other request to `next`.
 */
export function grpcUnary(services: readonly ServiceImplSpec[], options: GrpcUnaryOptions, next: RequestHandler): RequestHandler {
  const ready = { ...options, interceptors: [...options.interceptors] };
  const methods = new Map<string, UnarySpec>();
  for (const service of services) {
    for (const spec of Object.values(service.methods)) {
      if (spec.kind === "unary") methods.set(`/${service.service.typeName}/${spec.method.name}`, spec);
    }
  }
  return (request, response) => {
    if (!(request instanceof http2.Http2ServerRequest) || request.method !== "POST") return next(request, response);
    const spec = methods.get(request.url);
    const headers = request.headers;
    const encoding = headers["grpc-encoding"];
    if (spec === undefined || !BINARY_GRPC.test(headers["content-type"] ?? "") || (encoding !== undefined && encoding !== "identity")) return next(request, response);
    void serve(spec, request, response as http2.Http2ServerResponse, ready);
  };
}

async function serve(spec: UnarySpec, request: http2.Http2ServerRequest, response: http2.Http2ServerResponse, options: GrpcUnaryOptions & { interceptors: Interceptor[] }): Promise<void> {
  const stream = request.stream;
  const requestHeader: [string, string][] = [];
  for (const [name, value] of Object.entries(request.headers)) {
    if (name.charCodeAt(0) === 58 /* ":" */ || value === undefined) continue;
    requestHeader.push([name, Array.isArray(value) ? value.join(", ") : value]);
  }
  const left = new AbortController();
  const onClose = () => left.abort(new ConnectError("the client closed the call", Code.Canceled));
  stream.once("close", onClose);
  const timeout = parseTimeout((request.headers["grpc-timeout"] as string | undefined) ?? null, options.maxTimeoutMs);
  const context = createHandlerContext({
    service: spec.method.parent,
    method: spec.method,
    protocolName: "grpc",
    requestMethod: "POST",
    ...(timeout.timeoutMs === undefined ? {} : { timeoutMs: timeout.timeoutMs }),
    shutdownSignal: options.shutdownSignal,
    requestSignal: left.signal,
    requestHeader,
    url: `http://${request.authority}${request.url}`,
    responseHeader: { "content-type": contentTypeProto },
    responseTrailer: { "grpc-status": grpcStatusOk },
    contextValues: options.contextValues(request),
  });
  let body: Buffer | undefined;
  let failure: ConnectError | undefined;
  try {
    if (timeout.error !== undefined) throw timeout.error;
    const input = parse(spec, await readMessage(request, options.readMaxBytes, context.signal));
    const output = await invokeUnaryImplementation(spec, context, input, options.interceptors);
    const bytes = toBinary(spec.method.output, output);
    if (bytes.length > options.writeMaxBytes) {
      throw new ConnectError(`message size ${bytes.length} is larger than configured writeMaxBytes ${options.writeMaxBytes}`, Code.ResourceExhausted);
    }
    body = Buffer.allocUnsafe(PREFIX_BYTES + bytes.length);
    body[0] = 0;
    body.writeUInt32BE(bytes.length, 1);
    body.set(bytes, PREFIX_BYTES);
  } catch (error) {
    failure = error instanceof ConnectError ? error : new ConnectError("internal error", Code.Internal, undefined, undefined, error);
  } finally {
    stream.off("close", onClose);
    context.abort(failure ?? CALL_ENDED);
  }
  if (failure !== undefined) setTrailerStatus(context.responseTrailer, failure);
  if (stream.destroyed || stream.closed) return;
  const head: http2.OutgoingHttpHeaders = {};
  context.responseHeader.forEach((value, name) => (head[name] = value));
  const trailer: http2.OutgoingHttpHeaders = {};
  context.responseTrailer.forEach((value, name) => (trailer[name] = value));
  try {
    // Node's response object sends the trailers once the body is out.
    response.writeHead(200, head);
    response.addTrailers(trailer);
    if (body === undefined) response.end();
    else response.end(body);
  } catch {
    // The client reset the stream while it was being answered: no one is left to tell.
    return;
  }
  // Answered before the client finished sending (a refusal of an oversized body): tell it to stop.
  if (!request.readableEnded) resetSoon(stream);
}

/** The request message, or the error connect gives for bytes that are not one. */
function parse(spec: UnarySpec, bytes: Uint8Array) {
  try {
    return fromBinary(spec.method.input, bytes);
  } catch (error) {
    throw new ConnectError(`parse binary: ${error instanceof Error ? error.message : String(error)}`, Code.Internal);
  }
}

/**
 * The request's one enveloped message, refused past readMaxBytes without buffering the rest, and
 * given up when the call's signal aborts (its deadline, shutdown): a body that never ends holds nothing.
 */
function readMessage(request: http2.Http2ServerRequest, readMaxBytes: number, signal: AbortSignal): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(ConnectError.from(signal.reason, Code.Canceled));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    /** The envelope's declared message length, once its prefix has arrived. */
    let length: number | undefined;
    const done = (error?: ConnectError) => {
      request.off("data", onData);
      request.off("end", onEnd);
      request.off("aborted", onAborted);
      request.off("error", onAborted);
      signal.removeEventListener("abort", onSignal);
      if (error === undefined) return;
      // The rest of the body stays unread (and uncredited) until the answer's reset ends the stream.
      request.pause();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
      if (size < PREFIX_BYTES) return;
      length ??= (chunks.length === 1 ? chunk : Buffer.concat(chunks)).readUInt32BE(1);
      if (length > readMaxBytes) done(new ConnectError(`message size ${length} is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted));
      else if (size > PREFIX_BYTES + length) done(new ConnectError("protocol error: received extra input message for unary method", Code.Unimplemented));
    };
    const onEnd = () => {
      if (size === 0) return done(new ConnectError("protocol error: missing input message for unary method", Code.Unimplemented));
      if (length === undefined || size !== PREFIX_BYTES + length) {
        return done(new ConnectError(`protocol error: incomplete envelope of ${size} bytes`, Code.InvalidArgument));
      }
      const all = Buffer.concat(chunks, size);
      if (all[0] !== 0) return done(new ConnectError(`protocol error: unexpected envelope flags ${all[0]} on an uncompressed call`, Code.Internal));
      done();
      resolve(all.subarray(PREFIX_BYTES));
    };
    const onAborted = () => done(new ConnectError("the client closed the call", Code.Canceled));
    const onSignal = () => done(ConnectError.from(signal.reason, Code.Canceled));
    signal.addEventListener("abort", onSignal, { once: true });
    request.on("data", onData);
    request.once("end", onEnd);
    request.once("aborted", onAborted);
    request.once("error", onAborted);
  });
}
