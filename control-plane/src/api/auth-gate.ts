// Authentication before the body. Connect reads a unary request's whole body (up to the message
// limit) before any interceptor runs, so a client without a valid token could make the server
// buffer megabytes per request. This gate sits in front of the Connect handler, looks only at
// the headers, and refuses an unauthenticated call in the protocol's own form; the body is never
// read and, on HTTP/2, the stream is reset so the client stops sending it.
//
// Refusing is made cheap, since a flood of them competes with authorized calls for the event
// loop: an HTTP/2 stream whose headers already decide it (no token, a secret of a shape Keel
// never issues or with a forged tag, a service needing a client certificate) is refused as it arrives, before Node
// builds request and response objects for it; answers are prepared once (refusal.ts); nothing
// is logged per call. Answers go out at a bounded rate (refusal-pacer.ts), so a flood waits for
// them instead of taking the CPU. A connection that keeps sending unauthenticated calls is shed (GOAWAY).
import type http from "node:http";
import http2 from "node:http2";
import type { TLSSocket } from "node:tls";
import type { Logger } from "pino";
import { SECRET_SHAPE, type TokenRole } from "../ledger/api-token.repository.js";
import { rolesFor, type TokenVerifier } from "./auth.js";
import { quiet, refuseHttp1, refuseStream, resetSoon, type RefusalReason } from "./refusal.js";
import { createRefusalPacer, type RefusalPacerOptions } from "./refusal-pacer.js";
import { createTokenChecks, type TokenChecks } from "./token-checks.js";
import { createUnprovenIntake, DEFAULT_INTAKE, type IntakeOptions, type NewConnection } from "./unproven-intake.js";

/** Unauthenticated calls one HTTP/2 connection may make before it is closed. */
export const MAX_UNAUTHENTICATED_PER_CONNECTION = 64;
/** How long a shed connection's open streams get to finish before it is cut. */
const SHED_GRACE_MS = 1_000;
/** At most one summary line of refusals per this period. */
const SUMMARY_EVERY_MS = 10_000;

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
  /** Unauthenticated calls per HTTP/2 connection before it is shed; default MAX_UNAUTHENTICATED_PER_CONNECTION. */
  readonly maxUnauthenticatedPerConnection?: number;
  /** Called on an HTTP/2 connection's calls that passed the gate (the server widens its flow-control windows). */
  readonly onAuthorized?: (session: http2.Http2Session) => void;
  /** How fast refused HTTP/2 calls are answered (refusal-pacer.ts); default DEFAULT_REFUSAL_PACE. */
  readonly refusalPace?: RefusalPacerOptions;
  /** The budget of refusals past which refused connections without an authorized call are not read (unproven-intake.ts). */
  readonly intake?: IntakeOptions;
  /** Where the periodic summary of refusals goes. */
  readonly log?: Logger;
}

export interface AuthGate {
  /** The request handler for both listeners; it runs after `screenStream` let an HTTP/2 stream through. */
  readonly handle: RequestHandler;
  /** Looks at a new HTTP/2 stream's headers; true when it refused the stream there and then. */
  screenStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): boolean;
  /** Whether a new connection may be read at all; false when it was parked (unproven-intake.ts). */
  admitConnection(connection: NewConnection): boolean;
}

/** What the headers alone say: not gated here, refused, or a secret to check. */
type Verdict = { readonly refuse: RefusalReason } | { readonly secret: string } | undefined;

/** The service of an RPC path (/package.Service/Method, maybe with a query), or undefined. */
function serviceOf(path: string): string | undefined {
  const end = path.indexOf("?");
  const bare = end < 0 ? path : path.slice(0, end);
  const slash = bare.indexOf("/", 1);
  if (bare.charCodeAt(0) !== 47 || slash < 2 || slash === bare.length - 1 || bare.indexOf("/", slash + 1) >= 0) return undefined;
  return bare.slice(1, slash);
}

function precheck(
  path: string,
  method: string | undefined,
  authorization: string | string[] | undefined,
  socket: Partial<TLSSocket> | null | undefined,
  clientCertServices: ReadonlySet<string>,
  tokens: TokenChecks,
): Verdict {
  const service = serviceOf(path);
  // Anything but a known service (health, unknown) goes on as is. CORS preflights carry no
  // credentials by design; they reach no handler's code either.
  if (service === undefined || rolesFor(service) === undefined || method === "OPTIONS") return undefined;
  if (clientCertServices.has(service) && socket?.authorized !== true) return { refuse: "client-cert" };
  const secret = typeof authorization === "string" ? /^Bearer\s+(\S+)$/i.exec(authorization)?.[1] : undefined;
  if (secret === undefined) return { refuse: "missing" };
  // Keel issues one shape of secret; any other cannot be a token, so it costs no lookup.
  if (!SECRET_SHAPE.test(secret)) return { refuse: "unknown" };
  // A forged tag, or an untagged secret while its lookups are rationed, is decided here too.
  const screened = tokens.screen(secret);
  return screened === undefined ? { secret } : { refuse: screened };
}

export function authGate(verifier: TokenVerifier, next: RequestHandler, options: AuthGateOptions): AuthGate {
  const tokens = createTokenChecks(verifier, options.maxUnprovenChecks);
  const maxStrikes = options.maxUnauthenticatedPerConnection ?? MAX_UNAUTHENTICATED_PER_CONNECTION;
  const strikes = new WeakMap<http2.Http2Session, number>();
  const counts = { refused: 0, shed: 0 };
  const pacer = createRefusalPacer(options.refusalPace);
  // A held connection's refusals still waiting are never answered: answering would write to it.
  const intake = createUnprovenIntake(options.intake ?? DEFAULT_INTAKE, (session) => pacer.drop(session));
  let summaryDue = 0;

  /** Counts a refusal; past the summary period, logs how many there were (never one line per call). */
  const counted = () => {
    counts.refused++;
    const now = Date.now();
    if (now < summaryDue) return;
    if (summaryDue !== 0) options.log?.warn({ refused: counts.refused, connectionsShed: counts.shed, waitingForAnswer: pacer.held, connectionsHeldUnread: intake.held, connectionsParked: intake.parked }, "refused calls without a valid token");
    counts.refused = 0;
    counts.shed = 0;
    summaryDue = now + SUMMARY_EVERY_MS;
  };

  /** A connection that keeps calling without a valid token is told to go away and then cut. */
  const strike = (session: http2.Http2Session | undefined) => {
    if (session === undefined || session.closed || session.destroyed) return;
    const count = (strikes.get(session) ?? 0) + 1;
    strikes.set(session, count);
    if (count < maxStrikes) return;
    counts.shed++;
    // Its refusals still waiting for their turn (refusal-pacer.ts) are answered now, ahead of the
    // GOAWAY: the connection sends no more, and held open until the pace reached them they would
    // pile up. (Cutting it at once costs more: Node resets every open stream in one go, stalling
    // the event loop.) GOAWAY keeps the answers already queued; new streams are refused by the protocol.
    pacer.flush(session);
    session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    session.close();
    setTimeout(() => session.destroy(), SHED_GRACE_MS).unref();
  };

  const refuseH2 = (stream: http2.ServerHttp2Stream, contentType: string | undefined, reason: RefusalReason) => {
    counted();
    quiet(stream);
    pacer.answer(stream, () => refuseStream(stream, contentType ?? "", reason), stream.session);
    strike(stream.session);
    if (stream.session !== undefined) intake.refused(stream.session);
  };

  const refuse = (request: Request, response: Response, reason: RefusalReason) => {
    const contentType = request.headers["content-type"] ?? "";
    if (request instanceof http2.Http2ServerRequest) {
      refuseH2(request.stream, contentType, reason);
      return;
    }
    counted();
    refuseHttp1(response as http.ServerResponse, contentType, reason);
  };

  const admit = (request: Request, response: Response) => {
    if (request instanceof http2.Http2ServerRequest && request.stream.session !== undefined) {
      intake.proven(request.stream.session);
      options.onAuthorized?.(request.stream.session);
    }
    next(request, response);
  };

  const handle: RequestHandler = (request, response) => {
    const path = request.url ?? "/";
    const pathRoles = options.rolePaths[path.split("?")[0] ?? "/"];
    if (pathRoles !== undefined) {
      void admitPath(tokens, request, response, pathRoles, next);
      return;
    }
    const verdict = precheck(path, request.method, request.headers.authorization, request.socket as Partial<TLSSocket> | null, options.clientCertServices, tokens);
    if (verdict === undefined) {
      next(request, response);
      return;
    }
    if ("refuse" in verdict) {
      refuse(request, response, verdict.refuse);
      return;
    }
    tokens.check(verdict.secret).then(
      (result) => {
        if (result.kind === "valid") admit(request, response);
        else refuse(request, response, result.kind);
      },
      // A failed lookup (database down) is left to the handler, whose interceptor maps it.
      () => next(request, response),
    );
  };

  return {
    handle,
    admitConnection: (connection) => intake.admit(connection),
    screenStream(stream, headers) {
      if (stream.session !== undefined && intake.holds(stream.session)) {
        quiet(stream);
        return true;
      }
      const verdict = precheck(headers[":path"] ?? "/", headers[":method"], headers.authorization, stream.session?.socket as Partial<TLSSocket> | undefined, options.clientCertServices, tokens);
      if (verdict === undefined || !("refuse" in verdict)) return false;
      refuseH2(stream, headers["content-type"], verdict.refuse);
      return true;
    },
  };
}

async function admitPath(tokens: TokenChecks, request: Request, response: Response, roles: readonly TokenRole[], next: RequestHandler) {
  const secret = /^Bearer\s+(\S+)$/i.exec(request.headers.authorization ?? "")?.[1];
  let role: TokenRole | undefined;
  try {
    const result = secret === undefined || !SECRET_SHAPE.test(secret) ? undefined : await tokens.check(secret);
    role = result?.kind === "valid" ? result.role : undefined;
  } catch {
    role = undefined;
  }
  if (role !== undefined && (role === "admin" || roles.includes(role))) {
    next(request, response);
    return;
  }
  const status = role === undefined ? 401 : 403;
  const headers = { "content-type": "text/plain", ...(status === 401 ? { "www-authenticate": "Bearer" } : {}) };
  if (request instanceof http2.Http2ServerRequest) (response as http2.Http2ServerResponse).writeHead(status, headers);
  else (response as http.ServerResponse).writeHead(status, { ...headers, connection: "close" });
  response.end(role === undefined ? "a bearer token is required\n" : `needs a ${[...roles, "admin"].join(" or ")} token\n`);
  if (request instanceof http2.Http2ServerRequest) {
    const stream = request.stream;
    response.once("finish", () => resetSoon(stream));
  }
}
