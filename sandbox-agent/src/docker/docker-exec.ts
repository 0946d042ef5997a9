// One command in a workspace container. It runs as `sh -c WRAPPER marker secs argv...` (see
// exec-scripts.ts): the shell is the exec's session leader, runs the command under the
// image's `timeout -s KILL` and, when the command ends, kills whatever it left running in its
// session (a command that wants a daemon must setsid it, and it still dies at release). The
// attach stream is demultiplexed by hand into stdout and stderr chunks forwarded as they
// arrive, counted against maxOutputBytes; past the cap, output is drained and dropped, so the
// command never blocks on a full pipe and memory stays bounded. On timeout or abort the host
// stops waiting at once and kills the session with a second exec that finds the wrapper by its
// marker (shell builtins only: one free pid suffices). When even that cannot run (a fork bomb
// holds every pid), the in-container timeout fires a second later and the wrapper cleans up
// without forking; if the command still runs after that, the container is killed and started
// again: files in /workspace persist, /tmp is emptied.
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type { Duplex } from "node:stream";
import type Dockerode from "dockerode";
import { mergeEnv } from "../exec-env.js";
import { createOutputLimiter } from "../output-limiter.js";
import { WorkspaceError, type ExecRequest, type ExecResult, type OutputStreamName } from "../workspace-backend.js";
import { resolveWorkspaceDirectory, workspacePath } from "../workspace-folder.js";
import type { LiveWorkspace } from "./assignment-records.js";
import { createDemuxer } from "./demuxer.js";
import { failure, message, statusCode } from "./engine-errors.js";
import { KILLER, WRAPPER } from "./exec-scripts.js";

const KILL_EXEC_TIMEOUT_MS = 2_000;
const KILL_GRACE_MS = 1_500;

const delay = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves true when `promise` settles within `ms`, false otherwise. */
async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true, () => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** What an exec needs of the backend: the engine, its log, and the host folder of a workspace. */
export interface ExecHost {
  readonly docker: Dockerode;
  readonly log: (msg: string) => void;
  readonly folderPath: (folder: string) => string;
}

/** Runs a short helper exec to completion, draining its output; returns its exit code. */
async function runHelper(container: Dockerode.Container, cmd: string[]): Promise<number | null> {
  const exec = await container.exec({ Cmd: cmd, AttachStdout: true, AttachStderr: true });
  const stream = await exec.start({ hijack: true, stdin: false });
  await new Promise<void>((resolve) => {
    stream.on("data", () => undefined);
    stream.once("end", resolve);
    stream.once("close", resolve);
    stream.once("error", () => resolve());
  });
  stream.destroy();
  return (await exec.inspect()).ExitCode;
}

/**
 * Kills the command's session. If the kill exec cannot run (no pid left), the in-container
 * timeout still fires; if the command outlives that too, the container is killed and started.
 */
async function terminate(host: ExecHost, workspace: LiveWorkspace, marker: string, ended: Promise<void>, why: string, innerDeadline: number): Promise<void> {
  const { log } = host;
  const container = host.docker.getContainer(workspace.containerId);
  await within(
    runHelper(container, ["sh", "-c", KILLER, marker]).then(
      (code) => {
        if (code !== 0) log(`workspace ${workspace.workspaceId}: kill exec ended with ${code ?? "no exit code"}`);
      },
      (error: unknown) => log(`workspace ${workspace.workspaceId}: kill exec failed: ${message(error)}`),
    ),
    KILL_EXEC_TIMEOUT_MS,
  );
  // Give the in-container timeout its chance if it is due soon; do not wait long for it.
  if (await within(ended, Math.max(KILL_GRACE_MS, Math.min(innerDeadline + 1_000 - performance.now(), 3_000)))) return;
  log(`workspace ${workspace.workspaceId}: command survived the kill after ${why}; restarting the container's processes`);
  try {
    await container.kill({ signal: "SIGKILL" });
  } catch (error) {
    log(`workspace ${workspace.workspaceId}: container kill failed: ${message(error)}`);
  }
  await within(ended, KILL_GRACE_MS);
  try {
    await container.start();
  } catch (error) {
    if (statusCode(error) !== 304) log(`workspace ${workspace.workspaceId}: restart failed: ${message(error)}`);
  }
}

export async function executeInContainer(
  host: ExecHost,
  workspace: LiveWorkspace,
  request: ExecRequest,
  onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void,
  signal: AbortSignal,
): Promise<ExecResult> {
  signal.throwIfAborted();
  if (request.argv.length === 0) throw new WorkspaceError("backend_failure", "argv is empty");
  const { log } = host;
  const segments = await resolveWorkspaceDirectory(host.folderPath(workspace.folder), request.workingDirectory);
  const env = mergeEnv(workspace.env, request.env);
  const marker = `keel-exec-${randomUUID()}`;
  // A second past the host's deadline: the host kills first and precisely; this one is the
  // fallback for a host that cannot (no pid for the kill exec, or this process died).
  const innerSeconds = Math.ceil(request.timeoutMs / 1000) + 1;
  const container = host.docker.getContainer(workspace.containerId);
  const started = performance.now();

  const createExec = (): Promise<Dockerode.Exec> =>
    container.exec({
      Cmd: ["sh", "-c", WRAPPER, marker, String(innerSeconds), ...request.argv],
      AttachStdin: false,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
      Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
      WorkingDir: workspacePath(segments),
    });
  let exec: Dockerode.Exec;
  let stream: Duplex;
  try {
    try {
      exec = await createExec();
    } catch (error) {
      // 409: the container is stopped (engine restart, host reboot): start it and go on.
      if (statusCode(error) !== 409) throw error;
      log(`workspace ${workspace.workspaceId}: container not running; starting it`);
      await container.start();
      exec = await createExec();
    }
    stream = await exec.start({ hijack: true, stdin: false });
  } catch (error) {
    if (statusCode(error) === 404) throw new WorkspaceError("not_found", `workspace ${workspace.workspaceId} has no container`);
    throw failure("exec failed to start", error);
  }

  const limiter = createOutputLimiter(request.maxOutputBytes, onOutput);
  const demux = createDemuxer((name, chunk) => limiter.write(name, chunk));
  // While the output's consumer is behind, the stream is not read: the engine's buffers fill
  // and the command blocks on its pipe, instead of this process buffering without bound.
  let paused = false;
  let draining = false;
  stream.on("data", (chunk: Buffer) => {
    demux(chunk);
    if (paused || draining) return;
    const backlog = request.outputBacklog?.();
    if (backlog === undefined) return;
    paused = true;
    stream.pause();
    const resume = () => {
      paused = false;
      stream.resume();
    };
    backlog.then(resume, resume);
  });
  const ended = new Promise<void>((resolve) => {
    stream.once("end", resolve);
    stream.once("close", resolve);
    stream.once("error", (error) => {
      log(`workspace ${workspace.workspaceId}: exec stream error: ${error.message}`);
      resolve();
    });
  });

  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const stop = new Promise<"timeout" | "abort">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), request.timeoutMs);
    onAbort = () => resolve("abort");
    signal.addEventListener("abort", onAbort, { once: true });
  });
  const outcome = await Promise.race([ended.then(() => "ended" as const), stop]);
  clearTimeout(timer);
  if (onAbort !== undefined) signal.removeEventListener("abort", onAbort);
  if (outcome !== "ended") {
    // A paused stream never ends: drain it so the kill is seen to work.
    draining = true;
    stream.resume();
    await terminate(host, workspace, marker, ended, outcome === "timeout" ? `its ${request.timeoutMs} ms timeout` : "an abort", started + innerSeconds * 1000);
  }
  stream.destroy();

  // The engine may mark the exec finished a moment after the stream ends: poll briefly.
  let exitCode: number | null = null;
  for (let waited = 0, step = 2; waited < 1_000; waited += step, step = Math.min(step * 2, 50)) {
    try {
      const info = await exec.inspect();
      if (!info.Running) {
        exitCode = info.ExitCode;
        break;
      }
    } catch (error) {
      log(`workspace ${workspace.workspaceId}: exec inspect failed: ${message(error)}`);
      break;
    }
    await delay(step);
  }
  if (outcome === "abort") throw signal.reason instanceof Error ? signal.reason : new Error("exec aborted");
  return {
    exitCode: exitCode ?? (outcome === "timeout" ? 137 : -1),
    durationMs: Math.round(performance.now() - started),
    timedOut: outcome === "timeout",
    outputTruncated: limiter.truncated,
  };
}
