// The answers the auth gate gives a call it refuses, in each client protocol's own form. They are
// built once per reason, not per call: a flood of calls without a valid token should cost the
// server as little as a refusal can (no error objects with stack traces, no Headers, no JSON).
import type http from "node:http";
import http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, endStreamFlag, endStreamToJson, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";

/** How long after its answer a refused HTTP/2 stream is reset, so the reset cannot overtake the answer. */
const RESET_DELAY_MS = 50;

export type RefusalReason = "missing" | "unknown" | "busy" | "client-cert";

const REASONS: Readonly<Record<RefusalReason, { readonly code: Code; readonly message: string }>> = {
  missing: { code: Code.Unauthenticated, message: "missing bearer token (authorization: Bearer <token>)" },
  unknown: { code: Code.Unauthenticated, message: "unknown, revoked or expired token" },
  busy: { code: Code.ResourceExhausted, message: "too many unverified tokens are being checked right now; retry shortly" },
  "client-cert": { code: Code.Unauthenticated, message: "this service needs a client certificate signed by the server's client CA (mTLS)" },
};

interface Prepared {
  readonly grpcStatus: string;
  readonly grpcMessage: string;
  readonly httpStatus: number;
  /** Connect unary: the JSON error body. */
  readonly json: Uint8Array;
  /** Connect streaming: the end-of-stream envelope carrying the error. */
  readonly endStream: Uint8Array;
}

function prepare(reason: RefusalReason): Prepared {
  const { code, message } = REASONS[reason];
  const error = new ConnectError(message, code);
  return {
    grpcStatus: String(code),
    grpcMessage: encodeURIComponent(message),
    httpStatus: codeToHttpStatus(code),
    json: errorToJsonBytes(error, undefined),
    endStream: encodeEnvelope(endStreamFlag, new TextEncoder().encode(JSON.stringify(endStreamToJson(new Headers(), error, undefined)))),
  };
}

const PREPARED: Readonly<Record<RefusalReason, Prepared>> = {
  missing: prepare("missing"),
  unknown: prepare("unknown"),
  busy: prepare("busy"),
  "client-cert": prepare("client-cert"),
};

export function refusalMessage(reason: RefusalReason): string {
  return REASONS[reason].message;
}

const GRPC = /^application\/grpc(-web)?(\+|;|$)/i;
const CONNECT_STREAM = /^application\/connect\+/i;

/** The media type without parameters, as a refusal echoes it back. */
function baseType(contentType: string, fallback: string): string {
  const semi = contentType.indexOf(";");
  return (semi < 0 ? contentType : contentType.slice(0, semi)) || fallback;
}

/**
 * The status line, headers and body of a refusal for a request of `contentType`: gRPC and gRPC-Web
 * get a trailers-only response (the status in the one header block), a Connect stream an
 * end-of-stream envelope, Connect unary and anything else the HTTP status and a JSON error.
 */
function answerFor(contentType: string, reason: RefusalReason): { status: number; headers: Record<string, string>; body: Uint8Array | undefined } {
  const prepared = PREPARED[reason];
  if (GRPC.test(contentType)) {
    return {
      status: 200,
      headers: { "content-type": baseType(contentType, "application/grpc"), "grpc-status": prepared.grpcStatus, "grpc-message": prepared.grpcMessage },
      body: undefined,
    };
  }
  if (CONNECT_STREAM.test(contentType)) {
    return { status: 200, headers: { "content-type": baseType(contentType, "application/connect+json") }, body: prepared.endStream };
  }
  return { status: prepared.httpStatus, headers: { "content-type": "application/json" }, body: prepared.json };
}

const ignore = (): void => {};

/**
 * Gives a stream about to be refused a listener for 'error': nothing else listens on a stream
 * refused from its headers, and an unheard one (a client's reset, its connection cut, while the
 * refusal waits or is sent) would be thrown.
 */
export function quiet(stream: http2.ServerHttp2Stream): void {
  stream.on("error", ignore);
}

/** Refuses a quieted HTTP/2 stream: the answer, then a reset so the client stops sending its body. */
export function refuseStream(stream: http2.ServerHttp2Stream, contentType: string, reason: RefusalReason): void {
  if (stream.destroyed || stream.closed) return;
  const answer = answerFor(contentType, reason);
  try {
    stream.respond({ ":status": answer.status, ...answer.headers }, { endStream: answer.body === undefined });
    if (answer.body !== undefined) stream.end(answer.body);
  } catch {
    // The client reset the stream while it was being answered: nothing is left to refuse.
    return;
  }
  resetSoon(stream);
}

/**
 * Refuses an HTTP/1.1 request. The connection closes after the answer, so Node does not read the
 * unread body to reuse it.
 */
export function refuseHttp1(response: http.ServerResponse, contentType: string, reason: RefusalReason): void {
  const answer = answerFor(contentType, reason);
  response.writeHead(answer.status, { ...answer.headers, connection: "close" });
  response.end(answer.body);
}

/**
 * Streams refused recently, reset in batches by one timer rather than one timer per refused call.
 * The reset waits: queued at once it can overtake the answer's frames, and a client that sees the
 * reset first has no status to report. A stream is reset on the second tick after its refusal, so
 * it always gets at least RESET_DELAY_MS.
 */
let queued: http2.ServerHttp2Stream[] = [];
let due: http2.ServerHttp2Stream[] = [];
let resetTimer: NodeJS.Timeout | undefined;

function resetTick(): void {
  // RST_STREAM NO_ERROR after a complete answer, as RFC 9113 §8.1 allows.
  for (const stream of due) if (!stream.destroyed && !stream.closed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
  due = queued;
  queued = [];
  resetTimer = due.length === 0 ? undefined : setTimeout(resetTick, RESET_DELAY_MS).unref();
}

export function resetSoon(stream: http2.ServerHttp2Stream): void {
  queued.push(stream);
  resetTimer ??= setTimeout(resetTick, RESET_DELAY_MS).unref();
}
