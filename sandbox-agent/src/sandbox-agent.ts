// The sandbox host's side of SandboxService.Attach: register, heartbeat, run workspace
// commands on a WorkspaceBackend and stream what they print back, and keep doing so across
// lost connections.
//
// Output goes out in as few messages as the transport allows (output-batcher.ts): merged while
// it is busy, sent the moment it asks for more, up to the chunk size the control plane announced.
//
// While disconnected, output and results wait in a bounded buffer and are sent after the next
// registration. Results of finished execs are also kept for a while (RECENT_RESULTS_MS), so a
// control plane that restarted, or whose copy of a result was lost on the wire, can ask for a
// command again by id (a reattach) and get its real outcome instead of declaring it unknown.

import { randomUUID } from "node:crypto";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import {
  AttachRequestSchema,
  CommandResultSchema,
  OutputStream,
  SandboxService,
  type AttachRequest,
  type WorkspaceCommand,
} from "../../gen/keel/v1/sandbox_service_pb.js";
import { OutputBatcher, type OutputOutlet } from "./output-batcher.js";
import { DEFAULT_WORKSPACE_LIMITS, WorkspaceError, type WorkspaceBackend, type WorkspaceLimits } from "./workspace-backend.js";

export interface SandboxAgentOptions {
  readonly controlPlaneUrl: string;
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

/** How long a finished exec's result is kept for a control plane that asks again. */
const RECENT_RESULTS_MS = 10 * 60_000;
const MAX_RECENT_RESULTS = 2_000;
/** Output waiting for a connection beyond this is dropped (results are always kept). */
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** Output chunk size until the control plane announces its own (one that does not keeps to this). */
const DEFAULT_OUTPUT_CHUNK_BYTES = 32 * 1024;
/**
 * Output queued for the stream past which execs stop reading their commands' output (the
 * transport is behind: HTTP/2 flow control, a control plane whose ledger is behind), and the
 * level at which they go on. Keeps this process's memory bounded on a fast stream.
 */
const OUTPUT_HIGH_WATER_BYTES = 8 * 1024 * 1024;
const OUTPUT_LOW_WATER_BYTES = 2 * 1024 * 1024;
const DEFAULT_EXEC_TIMEOUT_MS = 120_000;
const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
const DEFAULT_READ_BYTES = 1024 * 1024;

type RequestInit = MessageInitShape<typeof AttachRequestSchema>;
type ResultInit = MessageInitShape<typeof CommandResultSchema>;

/** A request stream fed by pushes; what the transport has not taken yet can be taken back. */
class RequestQueue implements AsyncIterable<AttachRequest> {
  private readonly items: AttachRequest[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  /** Output bytes queued and not yet taken by the transport. */
  private outputBytes = 0;
  private waiters: (() => void)[] = [];

  /** @param hungry Called when the transport wants a message and none is queued: a chance to send output held back. */
  constructor(private readonly hungry: () => void) {}

  /** Whether the transport is waiting for a message (it took everything and wrote it). */
  get waiting(): boolean {
    return this.wake !== undefined;
  }

  push(item: AttachRequest): void {
    if (this.ended) return;
    this.items.push(item);
    this.outputBytes += outputBytesOf(item);
    this.wake?.();
  }

  /** Ends the stream and returns what was never handed to the transport. */
  end(): AttachRequest[] {
    this.ended = true;
    this.wake?.();
    this.outputBytes = 0;
    this.release();
    return this.items.splice(0);
  }

  /** A promise while too much output waits for the transport, settling once enough was taken. */
  backlog(): Promise<void> | undefined {
    if (this.ended || this.outputBytes < OUTPUT_HIGH_WATER_BYTES) return undefined;
    return new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  private release(): void {
    if (this.outputBytes > OUTPUT_LOW_WATER_BYTES) return;
    for (const resolve of this.waiters.splice(0)) resolve();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<AttachRequest> {
    while (!this.ended) {
      if (this.items.length === 0) this.hungry();
      const next = this.items.shift();
      if (next !== undefined) {
        this.outputBytes -= outputBytesOf(next);
        this.release();
        yield next;
        continue;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

const outputBytesOf = (request: AttachRequest): number => (request.message.case === "output" ? request.message.value.chunk.byteLength : 0);

interface RunningExec {
  readonly workspaceId: string;
  readonly abort: AbortController;
}

function failure(commandId: string, error: unknown): ResultInit {
  const reason = error instanceof WorkspaceError ? error.reason : "backend_failure";
  return { commandId, ok: false, error: error instanceof Error ? error.message : String(error), errorReason: reason };
}

export function createSandboxAgent(options: SandboxAgentOptions): SandboxAgent {
  const log = options.log;
  const backend = options.backend;
  const limits = options.limits ?? DEFAULT_WORKSPACE_LIMITS;
  const instanceId = randomUUID();
  const initialBackoffMs = options.initialBackoffMs ?? 200;
  const maxBackoffMs = options.maxBackoffMs ?? 5_000;

  const running = new Map<string, RunningExec>();
  const recent = new Map<string, { result: ResultInit; at: number }>();
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

  const send = (init: RequestInit) => {
    const request = create(AttachRequestSchema, init);
    if (live !== undefined) {
      live.push(request);
      return;
    }
    const size = sizeOf(request);
    if (request.message.case === "output" && bufferedBytes + size > MAX_BUFFERED_BYTES) {
      droppedBytes += size;
      return;
    }
    buffered.push(request);
    bufferedBytes += size;
  };

  const sendResult = (result: ResultInit) => send({ message: { case: "result", value: result } });

  const forgetOldResults = () => {
    const now = Date.now();
    for (const [id, entry] of recent) if (now - entry.at > RECENT_RESULTS_MS) recent.delete(id);
    while (recent.size >= MAX_RECENT_RESULTS) recent.delete(recent.keys().next().value!);
  };

  const exec = async (commandId: string, command: Extract<WorkspaceCommand["action"], { case: "exec" }>["value"]) => {
    const abort = new AbortController();
    running.set(commandId, { workspaceId: command.workspaceId, abort });
    const batcher = new OutputBatcher(outlet(commandId));
    let result: ResultInit;
    try {
      const outcome = await backend.exec(
        command.workspaceId,
        {
          commandId,
          argv: command.argv,
          workingDirectory: command.workingDirectory || "/workspace",
          env: command.env,
          timeoutMs: command.timeoutMs > 0 ? command.timeoutMs : DEFAULT_EXEC_TIMEOUT_MS,
          maxOutputBytes: command.maxOutputBytes > 0n ? Number(command.maxOutputBytes) : DEFAULT_MAX_OUTPUT_BYTES,
          // While disconnected there is no backlog to wait on: output is buffered up to a bound, then dropped.
          outputBacklog: () => live?.backlog(),
        },
        (stream, chunk) => batcher.push(stream, chunk),
        AbortSignal.any([abort.signal, stopping.signal]),
      );
      batcher.flush();
      result = {
        commandId,
        ok: true,
        exitCode: outcome.exitCode,
        durationMs: Math.round(outcome.durationMs),
        timedOut: outcome.timedOut,
        outputTruncated: outcome.outputTruncated,
        outputTail: batcher.tailBytes(),
        outputBytes: BigInt(batcher.bytes),
      };
    } catch (error) {
      batcher.flush();
      result = failure(commandId, error);
    }
    holding.delete(batcher);
    running.delete(commandId);
    if (stopping.signal.aborted) return;
    forgetOldResults();
    recent.set(commandId, { result, at: Date.now() });
    log.info({ commandId, workspaceId: command.workspaceId, ok: result.ok, exitCode: result.exitCode, durationMs: result.durationMs }, "exec finished");
    sendResult(result);
  };

  const handle = async (command: WorkspaceCommand): Promise<void> => {
    const commandId = command.commandId;
    const action = command.action;
    try {
      switch (action.case) {
        case "acquire": {
          const a = action.value;
          // The env carries granted secrets: it goes to the backend and nowhere else (never logged).
          await backend.acquire(
            { workspaceId: a.workspaceId, runId: a.runId, image: a.image, networkAccess: a.networkAccess, env: a.env, limits },
            stopping.signal,
          );
          workspaces.set(a.workspaceId, a.runId);
          log.info({ commandId, workspaceId: a.workspaceId, runId: a.runId, image: a.image, networkAccess: a.networkAccess }, "workspace acquired");
          sendResult({ commandId, ok: true });
          return;
        }
        case "release":
          await backend.release(action.value.workspaceId);
          workspaces.delete(action.value.workspaceId);
          log.info({ commandId, workspaceId: action.value.workspaceId }, "workspace released");
          sendResult({ commandId, ok: true });
          return;
        case "exec": {
          // Idempotent on the command id: a command already running or finished is never run again.
          if (running.has(commandId)) return;
          const done = recent.get(commandId);
          if (done !== undefined) return sendResult(done.result);
          log.info({ commandId, workspaceId: action.value.workspaceId }, "exec started");
          await exec(commandId, action.value);
          return;
        }
        case "reattach": {
          if (running.has(commandId)) return; // its output and result follow on this stream
          const done = recent.get(commandId);
          if (done !== undefined) return sendResult(done.result);
          sendResult({ commandId, ok: false, unknownCommand: true, error: `this host has no record of command ${commandId}` });
          return;
        }
        case "readFile": {
          const maxBytes = action.value.maxBytes > 0n ? Number(action.value.maxBytes) : DEFAULT_READ_BYTES;
          const data = await backend.readFile(action.value.workspaceId, action.value.path, maxBytes);
          sendResult({ commandId, ok: true, data });
          return;
        }
        case "writeFile":
          await backend.writeFile(action.value.workspaceId, action.value.path, action.value.content);
          sendResult({ commandId, ok: true });
          return;
        case "listFiles": {
          const entries = await backend.listFiles(action.value.workspaceId, action.value.path);
          sendResult({ commandId, ok: true, data: new TextEncoder().encode(JSON.stringify(entries)) });
          return;
        }
        case undefined:
          sendResult({ commandId, ok: false, error: "this host does not know the command", errorReason: "backend_failure" });
          return;
      }
    } catch (error) {
      if (stopping.signal.aborted) return;
      log.warn({ commandId, command: action.case, error: error instanceof Error ? error.message : String(error) }, "workspace command failed");
      sendResult(failure(commandId, error));
    }
  };

  /** What this host has: every workspace its backend knows, with the execs still running in each. */
  const announcement = async () => {
    for (const summary of await backend.list()) if (!workspaces.has(summary.workspaceId)) workspaces.set(summary.workspaceId, summary.runId);
    const commands = new Map<string, string[]>();
    for (const [commandId, exec] of running) commands.set(exec.workspaceId, [...(commands.get(exec.workspaceId) ?? []), commandId]);
    return [...workspaces].map(([workspaceId, runId]) => ({ workspaceId, runId, runningCommandIds: commands.get(workspaceId) ?? [] }));
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

  /** One Attach stream, from registration to its end. Returns whether the host got registered. */
  const session = async (): Promise<boolean> => {
    const transport = createGrpcTransport({
      baseUrl: options.controlPlaneUrl,
      interceptors: [bearer],
      // A control plane that vanished without closing the connection is noticed by pings.
      pingIntervalMs: 10_000,
      pingTimeoutMs: 10_000,
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
          log.info({ instanceId, replayed: waiting.length, reap: message.value.reapWorkspaceIds.length }, "attached to the control plane");
          void reap(message.value.reapWorkspaceIds).catch((error: unknown) => log.warn({ err: error }, "reaping failed"));
        } else if (message.case === "command") {
          void handle(message.value);
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
        while (!stopping.signal.aborted) {
          if (await session()) backoff = initialBackoffMs;
          if (stopping.signal.aborted) break;
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
        for (const exec of running.values()) exec.abort.abort();
        await finished;
        await backend.close();
      })();
      return stopped;
    },
  };
}
