import { setMaxListeners } from "node:events";
import http from "node:http";
import http2 from "node:http2";
import https from "node:https";
import type { AddressInfo, Socket } from "node:net";
import type { Duplex } from "node:stream";
import { isLoopbackHost } from "../../../common/loopback.js";
import { createServiceImplSpec, type ConnectRouter, type ServiceImpl, type ServiceImplSpec } from "@connectrpc/connect";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import { connectRequestHandler } from "./node-adapter.js";
import type { Logger } from "pino";
import { AgentService } from "../../../gen/keel/v1/agent_service_pb.js";
import { EmissionService } from "../../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { SandboxService } from "../../../gen/keel/v1/sandbox_service_pb.js";
import { authGate, type AuthGate } from "./auth-gate.js";
import { refusalPace } from "./refusal-pacer.js";
import { DEFAULT_REFUSAL_BUDGET_PER_SECOND, intakeBudget } from "./unproven-intake.js";
import { dashboardAssets } from "./dashboard-assets.js";
import { directFrames, withWire } from "./direct-frames.js";
import { grpcUnary } from "./grpc-unary.js";
import { authInterceptor, defaultDeadlineInterceptor, type TokenVerifier } from "./auth.js";
import { errorMappingInterceptor } from "./error-mapping.js";
import { nulStringInterceptor } from "./request-strings.js";
import { registerHealth, type HealthDeps } from "./health-service.js";
import { registerReflection } from "./reflection-service.js";
import type { Http2Limits } from "../config.js";

export const KEEL_SERVICES = [IngressService, EmissionService, RunService, AgentService, SandboxService] as const;

/** How long close() lets open HTTP/2 streams finish before it destroys their sessions. */
const CLOSE_GRACE_MS = 2_000;
/**
 * HTTP/2 receive windows once a connection has made an authorized call. The default 64 KiB (per
 * stream and per connection) lets a client send only that much per round trip, which throttles a
 * streaming upload such as a sandbox host's Attach stream to a fraction of loopback speed. Memory
 * stays bounded: a stream whose reader stops (its consumer is behind) stops being credited, so at
 * most this much waits unread. Until then a stream's window is 16 KiB (and the connection's the
 * protocol default, 64 KiB): a connection without a valid token can push only that much of a
 * body the server will never read. An authorized connection's first call waits one round trip
 * for the wider window if its body is larger.
 */
const FIRST_STREAM_WINDOW_BYTES = 16 * 1024;
const STREAM_WINDOW_BYTES = 4 * 1024 * 1024;
const SESSION_WINDOW_BYTES = 16 * 1024 * 1024;
/** A TLS handshake that takes longer than this is dropped: a half-open handshake holds a socket. */
const TLS_HANDSHAKE_TIMEOUT_MS = 10_000;
/** Services only sandbox hosts call: with a client CA configured, they need a verified client certificate. */
const CLIENT_CERT_SERVICES: ReadonlySet<string> = new Set([SandboxService.typeName]);
/** The metrics scrape reads the ledger: an operator's (or admin's) token, never anonymous. */
const ROLE_PATHS = { "/metrics": ["operator"] } as const;

export interface ServiceImpls {
  readonly ingress: ServiceImpl<typeof IngressService>;
  readonly emissions: ServiceImpl<typeof EmissionService>;
  readonly runs: ServiceImpl<typeof RunService>;
  readonly agents: ServiceImpl<typeof AgentService>;
  readonly sandbox: ServiceImpl<typeof SandboxService>;
  /** The standard health service; it reports NOT_SERVING once the server drains. */
  readonly health: Omit<HealthDeps, "draining">;
}

export interface ServerLimits {
  readonly maxMessageBytes: number;
  readonly defaultDeadlineMs: number;
  readonly maxDeadlineMs: number;
  readonly http2?: Http2Limits;
}

export const DEFAULT_HTTP2_LIMITS: Http2Limits = { maxConcurrentStreams: 1_000, idleTimeoutMs: 120_000, maxHeaderBytes: 16 * 1024, maxSessionsPerAddress: 1_024, refusalsPerSecond: 1_000, refusalBudgetPerSecond: DEFAULT_REFUSAL_BUDGET_PER_SECOND };

/** PEM certificate and key; with clientCa, SandboxService callers must present a certificate it signed. */
export interface TlsMaterial {
  readonly cert: string | Buffer;
  readonly key: string | Buffer;
  readonly clientCa?: string | Buffer;
}

export interface ListenOptions {
  readonly host: string;
  /** HTTP/2 (cleartext, or TLS with ALPN h2 and http/1.1): gRPC, gRPC-Web and Connect. */
  readonly port: number;
  /** HTTP/1.1 (or HTTPS): Connect JSON and gRPC-Web for browsers and curl. */
  readonly http1Port: number;
  /** Serve both listeners over TLS; without it they are plaintext, which needs loopback or `insecure`. */
  readonly tls?: TlsMaterial;
  readonly insecure?: boolean;
}

export interface KeelServer {
  listen(options: ListenOptions): Promise<{ url: string; http1Url: string }>;
  close(): Promise<void>;
}

export function createKeelServer(
  services: ServiceImpls,
  verifier: TokenVerifier,
  limits: ServerLimits,
  log: Logger,
  /** Plain HTTP paths that are not RPCs: health and metrics. */
  fallback: NonNullable<ConnectNodeAdapterOptions["fallback"]>,
): KeelServer {
  const shutdown = new AbortController();
  // Connect links every in-flight RPC to this signal (one listener each, removed when the RPC
  // ends), so more than 10 concurrent RPCs is normal, not a leak: no MaxListeners warning.
  setMaxListeners(0, shutdown.signal);
  // The dashboard's page and assets (no token: they hold no data) come before the other plain paths.
  const dashboard = dashboardAssets();
  // Outermost first: every error, including auth's, goes through the one mapping.
  const interceptors = [errorMappingInterceptor(log), authInterceptor(verifier), nulStringInterceptor(), defaultDeadlineInterceptor(limits.defaultDeadlineMs)];
  // An HTTP/2 call's stream, which Subscribe's direct frames are written to.
  const contextValues = (request: http.IncomingMessage | http2.Http2ServerRequest) => withWire("stream" in request ? request.stream : undefined);
  const connectHandler = connectRequestHandler({
    log,
    routes: (router: ConnectRouter) => {
      router.service(IngressService, services.ingress);
      router.service(EmissionService, services.emissions);
      // Subscribe's deliveries are frames encoded once per emission, not messages through connect's pipeline.
      const subscribe = router.handlers.findIndex((h) => h.method === EmissionService.method.subscribe);
      if (subscribe < 0) throw new Error("EmissionService.Subscribe is not routed");
      router.handlers[subscribe] = directFrames(router.handlers[subscribe] as UniversalHandler);
      router.service(RunService, services.runs);
      router.service(AgentService, services.agents);
      router.service(SandboxService, services.sandbox);
      registerReflection(router, KEEL_SERVICES);
      registerHealth(router, KEEL_SERVICES, { ...services.health, draining: shutdown.signal });
    },
    interceptors,
    contextValues,
    readMaxBytes: limits.maxMessageBytes,
    writeMaxBytes: limits.maxMessageBytes,
    maxTimeoutMs: limits.maxDeadlineMs,
    shutdownSignal: shutdown.signal,
    fallback: (request, response) => {
      if (!dashboard(request, response)) fallback(request, response);
    },
  });
  // Unary calls in binary gRPC over HTTP/2 skip connect's pipeline; the rest is connect's.
  const unaryServices: ServiceImplSpec[] = [
    createServiceImplSpec<typeof IngressService>(IngressService, services.ingress),
    createServiceImplSpec<typeof EmissionService>(EmissionService, services.emissions),
    createServiceImplSpec<typeof RunService>(RunService, services.runs),
    createServiceImplSpec<typeof AgentService>(AgentService, services.agents),
  ];
  const handler = grpcUnary(
    unaryServices,
    { interceptors, readMaxBytes: limits.maxMessageBytes, writeMaxBytes: limits.maxMessageBytes, maxTimeoutMs: limits.maxDeadlineMs, shutdownSignal: shutdown.signal, contextValues },
    connectHandler,
  );

  const h2Limits = limits.http2 ?? DEFAULT_HTTP2_LIMITS;
  const sessions = new Set<http2.ServerHttp2Session>();
  const sockets = new Set<Socket>();
  let h2: http2.Http2Server | http2.Http2SecureServer | undefined;
  let h1: http.Server | undefined;

  const listenOn = (server: http.Server | http2.Http2Server | http2.Http2SecureServer, host: string, port: number) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
    });

  return {
    async listen(options) {
      if (options.tls === undefined && options.insecure !== true && !isLoopbackHost(options.host)) {
        throw new Error(`refusing to serve plaintext on ${options.host}, which is not loopback: configure TLS or pass --insecure`);
      }
      const clientCertServices = options.tls?.clientCa === undefined ? new Set<string>() : CLIENT_CERT_SERVICES;
      const gate = authGate(verifier, handler, { clientCertServices, rolePaths: ROLE_PATHS, onAuthorized: widenWindows, refusalPace: refusalPace(h2Limits.refusalsPerSecond), intake: intakeBudget(h2Limits.refusalBudgetPerSecond), log });
      h2 = createHttp2Server(options.tls, h2Limits, gate, sessions);
      h1 = createHttp1Server(options.tls, h2Limits, gate.handle);
      for (const server of [h2, h1]) {
        server.on("connection", (socket: Socket) => {
          sockets.add(socket);
          socket.once("close", () => sockets.delete(socket));
        });
      }
      h1.requestTimeout = limits.maxDeadlineMs;
      const port = await listenOn(h2, options.host, options.port);
      const http1Port = await listenOn(h1, options.host, options.http1Port);
      const host = options.host.includes(":") ? `[${options.host}]` : options.host;
      const scheme = options.tls === undefined ? "http" : "https";
      return { url: `${scheme}://${host}:${port}`, http1Url: `${scheme}://${host}:${http1Port}` };
    },
    async close() {
      shutdown.abort(new Error("server shutting down"));
      // Idle HTTP/2 sessions (clients keep them for reuse) would hold close() open forever.
      for (const session of sessions) session.close();
      h1?.closeAllConnections();
      const closeServer = (server: { listening: boolean; close(done: () => void): unknown } | undefined) =>
        new Promise<void>((resolve) => (server?.listening === true ? server.close(() => resolve()) : resolve()));
      const closed = Promise.all([closeServer(h2), closeServer(h1)]);
      // A graceful session close waits for every open stream, and a stream whose response has
      // ended can stay half-open for good: an oversized request is refused without reading the
      // rest of its body, so the client never finishes sending. After a grace period, cut them.
      let grace: NodeJS.Timeout | undefined;
      await Promise.race([closed, new Promise<void>((resolve) => (grace = setTimeout(resolve, CLOSE_GRACE_MS)))]);
      clearTimeout(grace);
      for (const session of sessions) session.destroy();
      // A session whose client left a stream open without ending it (breaking out of a stream
      // it never cancelled) can outlive its destroy: cutting the connection underneath ends it.
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}

type Handler = (request: http.IncomingMessage | http2.Http2ServerRequest, response: http.ServerResponse | http2.Http2ServerResponse) => void;

/**
 * The HTTP/2 listener: TLS with ALPN h2 (and http/1.1 for Connect and gRPC-Web clients) when
 * given a certificate, else cleartext HTTP/2. Bounded per connection (streams, header bytes,
 * memory), per remote address (connections), and in time (idle connections are closed).
 */
function createHttp2Server(
  tls: TlsMaterial | undefined,
  limits: Http2Limits,
  gate: AuthGate,
  sessions: Set<http2.ServerHttp2Session>,
): http2.Http2Server | http2.Http2SecureServer {
  const handler = gate.handle;
  const options: http2.ServerOptions = {
    maxSessionMemory: 64,
    maxHeaderListPairs: 128,
    settings: { initialWindowSize: FIRST_STREAM_WINDOW_BYTES, maxConcurrentStreams: limits.maxConcurrentStreams, maxHeaderListSize: limits.maxHeaderBytes },
  };
  const server =
    tls === undefined
      ? http2.createServer(options, handler)
      : http2.createSecureServer(
          {
            ...options,
            ...tlsOptions(tls),
            allowHTTP1: true,
            ALPNProtocols: ["h2", "http/1.1"],
          },
          handler,
        );
  // Every new connection passes the gate first: one from an address flooding refused calls is
  // parked unread before any HTTP/2 session (or TLS handshake) is spent on it.
  const accept = server.listeners("connection") as ((socket: Socket) => void)[];
  server.removeAllListeners("connection");
  server.on("connection", (socket: Socket) => {
    if (gate.admitConnection(socket)) for (const listener of accept) listener.call(server, socket);
  });
  const perAddress = new Map<string, number>();
  const openStreams = new WeakMap<http2.ServerHttp2Session, number>();
  server.on("session", (session: http2.ServerHttp2Session) => {
    const address = session.socket?.remoteAddress ?? "unknown";
    const count = (perAddress.get(address) ?? 0) + 1;
    perAddress.set(address, count);
    sessions.add(session);
    openStreams.set(session, 0);
    session.on("close", () => {
      sessions.delete(session);
      const left = (perAddress.get(address) ?? 1) - 1;
      if (left <= 0) perAddress.delete(address);
      else perAddress.set(address, left);
    });
    if (count > limits.maxSessionsPerAddress) {
      session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      session.destroy();
      return;
    }
    screenStreams(session, gate);
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      openStreams.set(session, (openStreams.get(session) ?? 0) + 1);
      stream.once("close", () => openStreams.set(session, (openStreams.get(session) ?? 1) - 1));
    });
  });
  // Inactivity on a connection: close it when nothing is open on it (long streams keep theirs).
  server.setTimeout(limits.idleTimeoutMs);
  server.on("timeout", (target: http2.ServerHttp2Session | Duplex) => {
    // With TLS, HTTP/1.1 connections (ALPN http/1.1) time out here too, as plain sockets.
    if (!openStreams.has(target as http2.ServerHttp2Session)) (target as Duplex).destroy();
    else if ((openStreams.get(target as http2.ServerHttp2Session) ?? 0) === 0) (target as http2.ServerHttp2Session).close();
  });
  return server;
}

/**
 * Puts the gate's header screen in front of the session's own 'stream' listener (the one that
 * hands a stream to the server, where Node builds request and response objects for the handler):
 * a stream refused from its headers never costs those.
 */
function screenStreams(session: http2.ServerHttp2Session, gate: AuthGate): void {
  const forward = session.listeners("stream") as ((...args: unknown[]) => void)[];
  session.removeAllListeners("stream");
  session.on("stream", (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, ...rest: unknown[]) => {
    if (gate.screenStream(stream, headers)) return;
    for (const listener of forward) listener.call(session, stream, headers, ...rest);
  });
}

const widened = new WeakSet<http2.Http2Session>();

/** Gives a connection that made an authorized call the large flow-control windows, once. */
function widenWindows(session: http2.Http2Session): void {
  if (widened.has(session) || session.closed || session.destroyed) return;
  widened.add(session);
  try {
    session.settings({ initialWindowSize: STREAM_WINDOW_BYTES });
    session.setLocalWindowSize(SESSION_WINDOW_BYTES);
  } catch {
    // The session closed meanwhile: nothing to widen.
  }
}

/** The HTTP/1.1 listener (HTTPS when given a certificate), with a header size bound. */
function createHttp1Server(tls: TlsMaterial | undefined, limits: Http2Limits, handler: Handler): http.Server {
  const options = { maxHeaderSize: limits.maxHeaderBytes };
  const server = tls === undefined ? http.createServer(options, handler) : https.createServer({ ...options, ...tlsOptions(tls), ALPNProtocols: ["http/1.1"] }, handler);
  server.headersTimeout = 10_000;
  return server;
}

/** Client certificates are asked for but checked per service (auth-gate.ts), so connectors need none. */
function tlsOptions(tls: TlsMaterial) {
  return {
    cert: tls.cert,
    key: tls.key,
    minVersion: "TLSv1.2" as const,
    handshakeTimeout: TLS_HANDSHAKE_TIMEOUT_MS,
    ...(tls.clientCa === undefined ? {} : { ca: tls.clientCa, requestCert: true, rejectUnauthorized: false }),
  };
}
