// The sandbox host's side of SandboxService.Attach: register, heartbeat, run workspace
// commands on a WorkspaceBackend (workspace-commands.ts) and stream what they print back, and
// keep doing so across lost connections.
//
// Output goes out in as few messages as the transport allows (output-batcher.ts): merged while
// it is busy, sent the moment it asks for more, up to the chunk size the control plane announced.
//
// While disconnected, output and results wait in a bounded buffer and are sent after the next
// registration.

import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { AttachRequestSchema, OutputStream, SandboxService, type AttachRequest } from "../../gen/keel/v1/sandbox_service_pb.js";
import type { OutputBatcher, OutputOutlet } from "./output-batcher.js";
import { RequestQueue } from "./request-queue.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceBackend, type WorkspaceLimits } from "./workspace-backend.js";
import { createWorkspaceCommands, type RequestInit } from "./workspace-commands.js";

/** PEM texts for dialling an https:// control plane: its CA (default: the system CAs) and a client certificate for mTLS. */
export interface AgentTlsMaterial {
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
}

export interface SandboxAgentOptions {
  readonly controlPlaneUrl: string;
  /**
   * Further control planes (replicas on one ledger) to attach to, in order, when the one before
   * goes away or cannot be reached; the host stays one host whichever holds it.
   */
  readonly moreControlPlaneUrls?: readonly string[];
  readonly tls?: AgentTlsMaterial;
  readonly token: string;
  readonly hostId: string;
  readonly capacity: number;
  readonly labels: Readonly<Record<string, string>>;
  /** Images this host offers; empty means any image its backend can run. */
  readonly images: readonly string[];
  readonly backend: WorkspaceBackend;
  readonly log: Logger;
  readonly agentVersion: string;
  readonly limits?: WorkspaceLimits;
  readonly cpuMillis: number;
  readonly memoryBytes: number;
  /** First reconnect delay; it doubles per failed attempt up to maxBackoffMs. */
  readonly initialBackoffMs?: number;
  readonly maxBackoffMs?: number;
}

export interface SandboxAgent {
  readonly instanceId: string;
  /** Resolves when the agent stops (after stop()). */
  run(): Promise<void>;
  stop(): Promise<void>;
}

/** Output waiting for a connection beyond this is dropped (results are always kept). */
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** Output chunk size until the control plane announces its own (one that does not keeps to this). */
const DEFAULT_OUTPUT_CHUNK_BYTES = 32 * 1024;

export function createSandboxAgent(options: SandboxAgentOptions): SandboxAgent {
  const log = options.log;
  const backend = options.backend;
  const limits = options.limits ?? DEFAULT_WORKSPACE_LIMITS;
  const instanceId = randomUUID();
  const initialBackoffMs = options.initialBackoffMs ?? 200;
  const maxBackoffMs = options.maxBackoffMs ?? 5_000;

  /** Workspaces this host holds and the run each belongs to (from acquires and the backend's own list). */
  const workspaces = new Map<string, string>();
  const stopping = new AbortController();

  let live: RequestQueue | undefined;
  /** The output chunk size the control plane this agent is attached to takes. */
  let maxChunkBytes = DEFAULT_OUTPUT_CHUNK_BYTES;
  /** Batchers holding output back until the transport asks for more. */
  const holding = new Set<OutputBatcher>();
  const outlet = (commandId: string): OutputOutlet => ({
    send: (stream, chunk) =>
      send({ message: { case: "output", value: { commandId, stream: stream === "stderr" ? OutputStream.STDERR : OutputStream.STDOUT, chunk } } }),
    get maxChunkBytes() {
      return maxChunkBytes;
    },
    get transportWaiting() {
      return live?.waiting === true;
    },
    holding: (batcher) => holding.add(batcher),
  });
  const flushHeld = () => {
    const batchers = [...holding];
    holding.clear();
    for (const batcher of batchers) batcher.ready();
  };
  let buffered: AttachRequest[] = [];
  let bufferedBytes = 0;
  let droppedBytes = 0;

  const sizeOf = (request: AttachRequest) => (request.message.case === "output" ? request.message.value.chunk.byteLength : 64);

  /** Queues a request for the control plane; false when it was output dropped past the buffer bound. */
  const send = (init: RequestInit): boolean => {
    const request = create(AttachRequestSchema, init);
    if (live !== undefined) {
      live.push(request);
      return true;
    }
    const size = sizeOf(request);
    if (request.message.case === "output" && bufferedBytes + size > MAX_BUFFERED_BYTES) {
      droppedBytes += size;
      return false;
    }
    buffered.push(request);
    bufferedBytes += size;
    return true;
  };

  const commands = createWorkspaceCommands({
    backend,
    limits,
    log,
    stopping: stopping.signal,
    workspaces,
    send,
    outlet,
    finished: (batcher) => holding.delete(batcher),
    // While disconnected there is no backlog to wait on: output is buffered up to a bound, then dropped.
    outputBacklog: () => live?.backlog(),
  });

  /** What this host has: every workspace its backend knows, with the execs still running in each. */
  const announcement = async () => {
    for (const summary of await backend.list()) if (!workspaces.has(summary.workspaceId)) workspaces.set(summary.workspaceId, summary.runId);
    const byWorkspace = new Map<string, string[]>();
    for (const [commandId, exec] of commands.running) byWorkspace.set(exec.workspaceId, [...(byWorkspace.get(exec.workspaceId) ?? []), commandId]);
    return [...workspaces].map(([workspaceId, runId]) => ({ workspaceId, runId, runningCommandIds: byWorkspace.get(workspaceId) ?? [] }));
  };

  const reap = async (ids: readonly string[]) => {
    if (ids.length === 0) return;
    const doomed = new Set(ids);
    const removed = await backend.reap((workspaceId) => !doomed.has(workspaceId));
    for (const id of removed) workspaces.delete(id);
    log.info({ reaped: removed }, "reaped workspaces the control plane no longer knows");
  };

  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${options.token}`);
    return next(request);
  };

  const controlPlanes = [options.controlPlaneUrl, ...(options.moreControlPlaneUrls ?? [])];

  /** One Attach stream, from registration to its end. Returns whether the host got registered. */
  const session = async (controlPlaneUrl: string): Promise<boolean> => {
    const transport = createGrpcTransport({
      baseUrl: controlPlaneUrl,
      interceptors: [bearer],
      // A control plane that vanished without closing the connection is noticed by pings.
      pingIntervalMs: 10_000,
      pingTimeoutMs: 10_000,
      ...(options.tls === undefined ? {} : { nodeOptions: { ...options.tls } }),
    });
    const client = createClient(SandboxService, transport);
    const queue = new RequestQueue(flushHeld);
    const hangUp = new AbortController();
    const onStop = () => hangUp.abort();
    stopping.signal.addEventListener("abort", onStop, { once: true });
    let registered = false;
    let heartbeat: NodeJS.Timeout | undefined;
    try {
      queue.push(
        create(AttachRequestSchema, {
          message: {
            case: "register",
            value: {
              hostId: options.hostId,
              instanceId,
              capacity: { workspaces: options.capacity, cpuMillis: options.cpuMillis, memoryBytes: BigInt(options.memoryBytes) },
              labels: { ...options.labels },
              backends: [backend.name],
              images: [...options.images],
              running: await announcement(),
              agentVersion: options.agentVersion,
            },
          },
        }),
      );
      for await (const response of client.attach(queue, { signal: hangUp.signal })) {
        const message = response.message;
        if (message.case === "registered") {
          registered = true;
          maxChunkBytes = message.value.maxOutputChunkBytes > 0 ? message.value.maxOutputChunkBytes : DEFAULT_OUTPUT_CHUNK_BYTES;
          live = queue;
          const waiting = buffered;
          buffered = [];
          bufferedBytes = 0;
          for (const request of waiting) queue.push(request);
          if (droppedBytes > 0) log.warn({ droppedBytes }, "output produced while disconnected was dropped past the buffer limit");
          droppedBytes = 0;
          const interval = Math.max(100, message.value.heartbeatIntervalMs);
          heartbeat = setInterval(
            () => send({ message: { case: "heartbeat", value: { freeWorkspaces: Math.max(0, options.capacity - workspaces.size) } } }),
            interval,
          );
          log.info(
            { instanceId, controlPlane: controlPlaneUrl, replayed: waiting.length, reap: message.value.reapWorkspaceIds.length },
            "attached to the control plane",
          );
          void reap(message.value.reapWorkspaceIds).catch((error: unknown) => log.warn({ err: error }, "reaping failed"));
        } else if (message.case === "command") {
          void commands.handle(message.value);
        }
      }
      log.warn("the control plane ended the attach stream");
    } catch (error) {
      if (!stopping.signal.aborted) log.warn({ error: error instanceof Error ? error.message : String(error) }, "attach stream failed");
    } finally {
      clearInterval(heartbeat);
      stopping.signal.removeEventListener("abort", onStop);
      if (live === queue) live = undefined;
      // Output and results the transport never took go out again on the next stream; a
      // registration or heartbeat belongs to this stream only.
      const untaken = queue.end().filter((request) => request.message.case === "output" || request.message.case === "result");
      buffered = [...untaken, ...buffered];
      bufferedBytes = buffered.reduce((sum, request) => sum + sizeOf(request), 0);
      hangUp.abort();
    }
    return registered;
  };

  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        stopping.signal.removeEventListener("abort", done);
        resolve();
      }
      stopping.signal.addEventListener("abort", done, { once: true });
    });

  let finished: Promise<void> | undefined;
  let stopped: Promise<void> | undefined;
  return {
    instanceId,
    run() {
      finished ??= (async () => {
        let backoff = initialBackoffMs;
        let next = 0;
        // A control plane that ends the stream or cannot be reached hands over to the next one
        // at once; the backoff starts once every one has been tried without a registration.
        let failedInRow = 0;
        while (!stopping.signal.aborted) {
          const url = controlPlanes[next % controlPlanes.length]!;
          next += 1;
          if (await session(url)) {
            backoff = initialBackoffMs;
            failedInRow = 0;
          } else {
            failedInRow += 1;
          }
          if (stopping.signal.aborted) break;
          if (controlPlanes.length > 1 && failedInRow < controlPlanes.length) {
            log.info({ controlPlane: controlPlanes[next % controlPlanes.length] }, "attaching to the next control plane");
            continue;
          }
          const delay = Math.round(backoff * (0.8 + Math.random() * 0.4));
          log.info({ delayMs: delay }, "reconnecting to the control plane");
          await sleep(delay);
          backoff = Math.min(maxBackoffMs, backoff * 2);
        }
      })();
      return finished;
    },
    stop() {
      stopped ??= (async () => {
        stopping.abort();
        commands.abortAll();
        await finished;
        await backend.close();
      })();
      return stopped;
    },
  };
}
