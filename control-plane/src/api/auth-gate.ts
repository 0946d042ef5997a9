// Authentication before the body. Connect reads a unary request's whole body (up to the message
// limit) before any interceptor runs, so a client without a valid token could make the server
// buffer megabytes per request. This gate sits in front of the Connect handler, looks only at
// the headers, and refuses an unauthenticated call in the protocol's own error form; the body
// is never read and, on HTTP/2, the stream is reset so the client stops sending it.
import type http from "node:http";
import http2 from "node:http2";
import type { TLSSocket } from "node:tls";
import { Code, ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, endStreamFlag, endStreamToJson, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { TokenRole } from "../ledger/api-token.repository.js";
import { rolesFor, type TokenVerifier } from "./auth.js";
import { createTokenChecks, type TokenChecks } from "./token-checks.js";

const RESET_DELAY_MS = 50;

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;
export type RequestHandler = (request: Request, response: Response) => void;

export interface AuthGateOptions {
  /** Services whose callers must present a client certificate the listener verified (mTLS). */
  readonly clientCertServices: ReadonlySet<string>;
  /** Plain paths that need one of these roles (the metrics scrape). */
  readonly rolePaths: Readonly<Record<string, readonly TokenRole[]>>;
  /** Lookups of never-seen-valid secrets at once (token-checks.ts); default 8. */
  readonly maxUnprovenChecks?: number;
}

/** The bearer secret of a request, or undefined. */
function bearerOf(request: Request): string | undefined {
  const header = request.headers.authorization ?? "";
  return /^Bearer\s+(\S+)$/i.exec(header)?.[1];
}

/** Whether the connection carries a client certificate that chains to the configured CA. */
function hasVerifiedClientCert(request: Request): boolean {
  const socket = request.socket as Partial<TLSSocket> | null;
  return socket?.authorized === true;
}

export function authGate(verifier: TokenVerifier, next: RequestHandler, options: AuthGateOptions): RequestHandler {
  const tokens = createTokenChecks(verifier, options.maxUnprovenChecks);
  return (request, response) => {
    const path = (request.url ?? "/").split("?")[0] ?? "/";
    const pathRoles = options.rolePaths[path];
    if (pathRoles !== undefined) {
      void admitPath(tokens, request, response, pathRoles, next);
      return;
    }
    // An RPC path is /package.Service/Method; anything else (health, unknown) goes on as is.
    const service = /^\/([^/]+)\/[^/]+$/.exec(path)?.[1];
    // CORS preflights carry no credentials by design; they reach no handler's code either.
    if (service === undefined || rolesFor(service) === undefined || request.method === "OPTIONS") {
      next(request, response);
      return;
    }
    if (options.clientCertServices.has(service) && !hasVerifiedClientCert(request)) {
      refuse(request, response, `${service} needs a client certificate signed by the server's client CA (mTLS)`);
      return;
    }
    const secret = bearerOf(request);
    if (secret === undefined) {
      refuse(request, response, "missing bearer token (authorization: Bearer <token>)");
      return;
    }
    tokens.check(secret).then(
      (result) => {
        if (result.kind === "valid") next(request, response);
        else if (result.kind === "unknown") refuse(request, response, "unknown, revoked or expired token");
        else refuse(request, response, "too many unverified tokens are being checked right now; retry shortly", Code.ResourceExhausted);
      },
      // A failed lookup (database down) is left to the handler, whose interceptor maps it.
      () => next(request, response),
    );
  };
}

async function admitPath(tokens: TokenChecks, request: Request, response: Response, roles: readonly TokenRole[], next: RequestHandler) {
  const secret = bearerOf(request);
  let role: TokenRole | undefined;
  try {
    const result = secret === undefined ? undefined : await tokens.check(secret);
    role = result?.kind === "valid" ? result.role : undefined;
  } catch {
    role = undefined;
  }
  if (role !== undefined && (role === "admin" || roles.includes(role))) {
    next(request, response);
    return;
  }
  const status = role === undefined ? 401 : 403;
  writeHead(request, response, status, { "content-type": "text/plain", ...(status === 401 ? { "www-authenticate": "Bearer" } : {}) });
  response.end(role === undefined ? "a bearer token is required\n" : `needs a ${[...roles, "admin"].join(" or ")} token\n`);
  resetAfterResponse(request, response);
}

/** Answers Unauthenticated (or `code`) in the form the caller's protocol expects, without reading the body. */
function refuse(request: Request, response: Response, message: string, code: Code = Code.Unauthenticated): void {
  const error = new ConnectError(message, code);
  const contentType = request.headers["content-type"] ?? "";
  if (/^application\/grpc(-web)?(\+|;|$)/i.test(contentType)) {
    // gRPC and gRPC-Web: a trailers-only response, the status in the one header block.
    const headers = setTrailerStatus(new Headers({ "content-type": contentType.split(";")[0] ?? "application/grpc" }), error);
    const flat: Record<string, string> = {};
    headers.forEach((value, key) => (flat[key] = value));
    if (request instanceof http2.Http2ServerRequest) {
      request.stream.respond({ ":status": 200, ...flat }, { endStream: true });
      resetSoon(request.stream);
      return;
    }
    writeHead(request, response, 200, flat);
    response.end();
    return;
  }
  if (/^application\/connect\+/i.test(contentType)) {
    // A Connect stream: HTTP 200 and an end-of-stream envelope carrying the error.
    const body = new TextEncoder().encode(JSON.stringify(endStreamToJson(new Headers(), error, undefined)));
    writeHead(request, response, 200, { "content-type": contentType.split(";")[0] ?? "application/connect+json" });
    response.end(encodeEnvelope(endStreamFlag, body));
  } else {
    // Connect unary (POST or GET) and anything unrecognised: the HTTP status and a JSON error.
    writeHead(request, response, codeToHttpStatus(code), { "content-type": "application/json" });
    response.end(errorToJsonBytes(error, undefined));
  }
  resetAfterResponse(request, response);
}

/** On HTTP/1.1 the connection closes after a refusal, so Node does not read the unread body to reuse it. */
function writeHead(request: Request, response: Response, status: number, headers: Record<string, string>): void {
  if (request instanceof http2.Http2ServerRequest) (response as http2.Http2ServerResponse).writeHead(status, headers);
  else (response as http.ServerResponse).writeHead(status, { ...headers, connection: "close" });
}

/**
 * On HTTP/2, ends the stream once the response is out so the client stops sending a body no one
 * will read (RST_STREAM NO_ERROR, as RFC 9113 §8.1 allows).
 */
function resetAfterResponse(request: Request, response: Response): void {
  if (!(request instanceof http2.Http2ServerRequest)) return;
  const stream = request.stream;
  response.once("finish", () => resetSoon(stream));
}

/**
 * The reset waits a moment: queued at once it can overtake the response's frames, and a client
 * that sees the reset first has no status to report (and Node's client then never closes it).
 */
function resetSoon(stream: http2.ServerHttp2Stream): void {
  setTimeout(() => {
    if (!stream.destroyed && !stream.closed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
  }, RESET_DELAY_MS).unref();
}
