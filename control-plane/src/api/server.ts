import { setMaxListeners } from "node:events";
import http from "node:http";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import type { ConnectRouter, ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter, type ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { AgentService } from "../../../gen/keel/v1/agent_service_pb.js";
import { EmissionService } from "../../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { SandboxService } from "../../../gen/keel/v1/sandbox_service_pb.js";
import { authInterceptor, defaultDeadlineInterceptor, type TokenVerifier } from "./auth.js";
import { errorMappingInterceptor } from "./error-mapping.js";
import { nulStringInterceptor } from "./request-strings.js";
import { registerReflection } from "./reflection-service.js";

export const KEEL_SERVICES = [IngressService, EmissionService, RunService, AgentService, SandboxService] as const;

/** How long close() lets open HTTP/2 streams finish before it destroys their sessions. */
const CLOSE_GRACE_MS = 2_000;
/**
 * HTTP/2 receive windows. The default 64 KiB (per stream and per connection) lets a client send
 * only that much per round trip, which throttles a streaming upload such as a sandbox host's
 * Attach stream to a fraction of loopback speed. Memory stays bounded: a stream whose reader
 * stops (its consumer is behind) stops being credited, so at most this much waits unread.
 */
const STREAM_WINDOW_BYTES = 4 * 1024 * 1024;
const SESSION_WINDOW_BYTES = 16 * 1024 * 1024;

export interface ServiceImpls {
  readonly ingress: ServiceImpl<typeof IngressService>;
  readonly emissions: ServiceImpl<typeof EmissionService>;
  readonly runs: ServiceImpl<typeof RunService>;
  readonly agents: ServiceImpl<typeof AgentService>;
  readonly sandbox: ServiceImpl<typeof SandboxService>;
}

export interface ServerLimits {
  readonly maxMessageBytes: number;
  readonly defaultDeadlineMs: number;
  readonly maxDeadlineMs: number;
}

export interface ListenOptions {
  readonly host: string;
  /** HTTP/2 cleartext: gRPC, gRPC-Web and Connect. */
  readonly port: number;
  /** HTTP/1.1: Connect JSON and gRPC-Web for browsers and curl. */
  readonly http1Port: number;
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
  const handler = connectNodeAdapter({
    routes: (router: ConnectRouter) => {
      router.service(IngressService, services.ingress);
      router.service(EmissionService, services.emissions);
      router.service(RunService, services.runs);
      router.service(AgentService, services.agents);
      router.service(SandboxService, services.sandbox);
      registerReflection(router, KEEL_SERVICES);
    },
    // Outermost first: every error, including auth's, goes through the one mapping.
    interceptors: [errorMappingInterceptor(log), authInterceptor(verifier), nulStringInterceptor(), defaultDeadlineInterceptor(limits.defaultDeadlineMs)],
    readMaxBytes: limits.maxMessageBytes,
    writeMaxBytes: limits.maxMessageBytes,
    maxTimeoutMs: limits.maxDeadlineMs,
    shutdownSignal: shutdown.signal,
    fallback,
  });

  const h2 = http2.createServer({ maxSessionMemory: 64, settings: { initialWindowSize: STREAM_WINDOW_BYTES } }, handler);
  const h1 = http.createServer(handler);
  h1.requestTimeout = limits.maxDeadlineMs;
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.setLocalWindowSize(SESSION_WINDOW_BYTES);
    session.on("close", () => sessions.delete(session));
  });

  const listenOn = (server: http.Server | http2.Http2Server, host: string, port: number) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
    });

  return {
    async listen(options) {
      const port = await listenOn(h2, options.host, options.port);
      const http1Port = await listenOn(h1, options.host, options.http1Port);
      const host = options.host.includes(":") ? `[${options.host}]` : options.host;
      return { url: `http://${host}:${port}`, http1Url: `http://${host}:${http1Port}` };
    },
    async close() {
      shutdown.abort(new Error("server shutting down"));
      // Idle HTTP/2 sessions (clients keep them for reuse) would hold close() open forever.
      for (const session of sessions) session.close();
      h1.closeAllConnections();
      const closed = Promise.all([
        new Promise<void>((resolve) => (h2.listening ? h2.close(() => resolve()) : resolve())),
        new Promise<void>((resolve) => (h1.listening ? h1.close(() => resolve()) : resolve())),
      ]);
      // A graceful session close waits for every open stream, and a stream whose response has
      // ended can stay half-open for good: an oversized request is refused without reading the
      // rest of its body, so the client never finishes sending. After a grace period, cut them.
      let grace: NodeJS.Timeout | undefined;
      await Promise.race([closed, new Promise<void>((resolve) => (grace = setTimeout(resolve, CLOSE_GRACE_MS)))]);
      clearTimeout(grace);
      for (const session of sessions) session.destroy();
      await closed;
    },
  };
}
