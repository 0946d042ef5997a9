// Runs the control plane's workspace commands on the backend and answers each with one result.
// Execs are idempotent on their command id: one still running is not started again, and the
// result of one that finished is kept for a while (RECENT_RESULTS_MS), so a control plane that
// restarted, or whose copy of a result was lost on the wire, can ask again (a reattach) and
// get the real outcome instead of declaring it unknown.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Logger } from "pino";
import type { AttachRequestSchema, CommandResultSchema, WorkspaceCommand } from "../../gen/keel/v1/sandbox_service_pb.js";
import { OutputBatcher, type OutputOutlet } from "./output-batcher.js";
import { WorkspaceError, type WorkspaceBackend, type WorkspaceLimits } from "./workspace-backend.js";

export type RequestInit = MessageInitShape<typeof AttachRequestSchema>;
type ResultInit = MessageInitShape<typeof CommandResultSchema>;
type ExecCommand = Extract<WorkspaceCommand["action"], { case: "exec" }>["value"];

/** How long a finished exec's result is kept for a control plane that asks again. */
const RECENT_RESULTS_MS = 10 * 60_000;
const MAX_RECENT_RESULTS = 2_000;
const DEFAULT_EXEC_TIMEOUT_MS = 120_000;
const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
const DEFAULT_READ_BYTES = 1024 * 1024;

export interface WorkspaceCommandsOptions {
  readonly backend: WorkspaceBackend;
  readonly limits: WorkspaceLimits;
  readonly log: Logger;
  /** Aborted when the agent stops: running execs end and their results are not sent. */
  readonly stopping: AbortSignal;
  /** Workspaces this host holds and the run each belongs to; acquire and release keep it current. */
  readonly workspaces: Map<string, string>;
  send(init: RequestInit): boolean | void;
  /** Where an exec's output goes. */
  outlet(commandId: string): OutputOutlet;
  /** Called when an exec ends, so its batcher is no longer waiting for the transport. */
  finished(batcher: OutputBatcher): void;
  /** A promise while the transport is behind on output (see ExecRequest.outputBacklog). */
  readonly outputBacklog: () => Promise<void> | undefined;
}

export interface WorkspaceCommands {
  handle(command: WorkspaceCommand): Promise<void>;
  /** Execs still running, by command id, with the workspace each runs in. */
  readonly running: ReadonlyMap<string, { readonly workspaceId: string }>;
  /** Aborts every running exec. */
  abortAll(): void;
}

function failure(commandId: string, error: unknown): ResultInit {
  const reason = error instanceof WorkspaceError ? error.reason : "backend_failure";
  return { commandId, ok: false, error: error instanceof Error ? error.message : String(error), errorReason: reason };
}

export function createWorkspaceCommands(options: WorkspaceCommandsOptions): WorkspaceCommands {
  const { backend, limits, log, stopping, workspaces } = options;
  const running = new Map<string, { readonly workspaceId: string; readonly abort: AbortController }>();
  const recent = new Map<string, { result: ResultInit; at: number }>();
  /** The highest run-lease epoch each workspace has seen on an exec or a write. */
  const epochs = new Map<string, bigint>();

  /**
   * The fence: a command from a worker whose lease was since taken over (a lower epoch than one
   * already seen here) is refused, so a stale worker cannot act after its successor. Epoch 0 is
   * a command that carries none (a control plane from before the fence).
   */
  const staleness = (command: WorkspaceCommand, workspaceId: string): string | undefined => {
    const epoch = command.leaseEpoch;
    if (epoch === 0n) return undefined;
    const highest = epochs.get(workspaceId) ?? 0n;
    if (epoch < highest) {
      return `refused: the run's lease has moved on to epoch ${highest} in workspace ${workspaceId}; this command is from epoch ${epoch}, a worker that lost it`;
    }
    epochs.set(workspaceId, epoch);
    return undefined;
  };

  const sendResult = (result: ResultInit): void => {
    options.send({ message: { case: "result", value: result } });
  };

  const forgetOldResults = () => {
    const now = Date.now();
    for (const [id, entry] of recent) if (now - entry.at > RECENT_RESULTS_MS) recent.delete(id);
    while (recent.size >= MAX_RECENT_RESULTS) recent.delete(recent.keys().next().value!);
  };

  const exec = async (commandId: string, command: ExecCommand) => {
    const abort = new AbortController();
    running.set(commandId, { workspaceId: command.workspaceId, abort });
    const batcher = new OutputBatcher(options.outlet(commandId));
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
          outputBacklog: options.outputBacklog,
        },
        (stream, chunk) => batcher.push(stream, chunk),
        AbortSignal.any([abort.signal, stopping]),
      );
      batcher.flush();
      result = {
        commandId,
        ok: true,
        exitCode: outcome.exitCode,
        durationMs: Math.round(outcome.durationMs),
        timedOut: outcome.timedOut,
        // Output dropped while disconnected is output the control plane never gets: truncated too.
        outputTruncated: outcome.outputTruncated || batcher.lost,
        outputTail: batcher.tailBytes(),
        outputBytes: BigInt(batcher.bytes),
      };
    } catch (error) {
      batcher.flush();
      result = failure(commandId, error);
    }
    options.finished(batcher);
    running.delete(commandId);
    if (stopping.aborted) return;
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
          await backend.acquire({ workspaceId: a.workspaceId, runId: a.runId, image: a.image, networkAccess: a.networkAccess, env: a.env, limits }, stopping);
          workspaces.set(a.workspaceId, a.runId);
          log.info({ commandId, workspaceId: a.workspaceId, runId: a.runId, image: a.image, networkAccess: a.networkAccess }, "workspace acquired");
          sendResult({ commandId, ok: true });
          return;
        }
        case "release":
          await backend.release(action.value.workspaceId);
          workspaces.delete(action.value.workspaceId);
          epochs.delete(action.value.workspaceId);
          log.info({ commandId, workspaceId: action.value.workspaceId }, "workspace released");
          sendResult({ commandId, ok: true });
          return;
        case "exec": {
          // Idempotent on the command id: a command already running or finished is never run again.
          if (running.has(commandId)) return;
          const done = recent.get(commandId);
          if (done !== undefined) return sendResult(done.result);
          const stale = staleness(command, action.value.workspaceId);
          if (stale !== undefined) {
            log.warn({ commandId, workspaceId: action.value.workspaceId, leaseEpoch: String(command.leaseEpoch) }, "stale exec refused");
            return sendResult({ commandId, ok: false, error: stale, errorReason: "stale_lease" });
          }
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
        case "writeFile": {
          const stale = staleness(command, action.value.workspaceId);
          if (stale !== undefined) return sendResult({ commandId, ok: false, error: stale, errorReason: "stale_lease" });
          await backend.writeFile(action.value.workspaceId, action.value.path, action.value.content);
          sendResult({ commandId, ok: true });
          return;
        }
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
      if (stopping.aborted) return;
      log.warn({ commandId, command: action.case, error: error instanceof Error ? error.message : String(error) }, "workspace command failed");
      sendResult(failure(commandId, error));
    }
  };

  return {
    handle,
    running,
    abortAll() {
      for (const exec of running.values()) exec.abort.abort();
    },
  };
}
