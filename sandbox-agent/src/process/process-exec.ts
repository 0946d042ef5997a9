// One command of the process backend: a child process (under bubblewrap unless the agent runs
// with --allow-unsandboxed) leading its own process group, its output forwarded through the output limiter, killed as a
// group on timeout, abort, exit and release.
import { spawn } from "node:child_process";
import { constants as osConstants } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { mergeEnv } from "../exec-env.js";
import { errorCode } from "../host-files.js";
import { createOutputLimiter } from "../output-limiter.js";
import { WorkspaceError, type ExecRequest, type ExecResult, type OutputStreamName } from "../workspace-backend.js";
import { resolveWorkspaceDirectory, workspacePath } from "../workspace-folder.js";
import { bubblewrapArgs, type Bubblewrap } from "./bubblewrap.js";
import type { ProcessWorkspace } from "./workspace-marker.js";

/** After the main process exits, how long to wait for output still in its pipes. */
const DRAIN_AFTER_EXIT_MS = 200;

/** `sandbox` says which bubblewrap to run under (undefined: a plain child process); asked per command. */
export async function executeInProcess(
  workspace: ProcessWorkspace,
  request: ExecRequest,
  onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void,
  signal: AbortSignal,
  sandbox: () => Promise<Bubblewrap | undefined>,
): Promise<ExecResult> {
  signal.throwIfAborted();
  if (request.argv.length === 0) throw new WorkspaceError("backend_failure", "argv is empty");
  const segments = await resolveWorkspaceDirectory(workspace.files, request.workingDirectory);
  const env = mergeEnv({ PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin" }, workspace.env, request.env);
  const bwrap = await sandbox();
  let command: string;
  let args: string[];
  let cwd: string;
  if (bwrap === undefined) {
    command = request.argv[0]!;
    args = request.argv.slice(1);
    cwd = path.join(workspace.files, ...segments);
  } else {
    command = bwrap.binary;
    args = bubblewrapArgs(
      bwrap,
      { tmpfsBytes: workspace.marker.tmpfsBytes, files: workspace.files, workingDirectory: workspacePath(segments) },
      request.argv,
    );
    cwd = workspace.files;
  }

  const started = performance.now();
  const limiter = createOutputLimiter(request.maxOutputBytes, onOutput);
  return new Promise<ExecResult>((resolve, reject) => {
    // detached: the child leads a new process group, so one kill reaches its descendants.
    const child = spawn(command, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    let timedOut = false;
    let aborted = false;
    let exitCode: number | undefined;
    let finished = false;
    let drainTimer: NodeJS.Timeout | undefined;
    const killGroup = (): void => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        // already gone
      }
    };
    const handle = { kill: killGroup };
    workspace.running.add(handle);
    const deadline = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, request.timeoutMs);
    const onAbort = (): void => {
      aborted = true;
      killGroup();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    const finish = (error?: Error): void => {
      if (finished) return;
      finished = true;
      clearTimeout(deadline);
      if (drainTimer !== undefined) clearTimeout(drainTimer);
      signal.removeEventListener("abort", onAbort);
      workspace.running.delete(handle);
      // Leftover background processes of this command die with it (there is no container
      // to contain them, and under bubblewrap the pid namespace ends with the command too).
      killGroup();
      child.stdout.destroy();
      child.stderr.destroy();
      if (aborted) {
        reject(signal.reason instanceof Error ? signal.reason : new Error("exec aborted"));
      } else if (error !== undefined) {
        reject(error);
      } else {
        resolve({ exitCode: exitCode ?? -1, durationMs: Math.round(performance.now() - started), timedOut, outputTruncated: limiter.truncated });
      }
    };
    child.stdout.on("data", (chunk: Buffer) => limiter.write("stdout", chunk));
    child.stderr.on("data", (chunk: Buffer) => limiter.write("stderr", chunk));
    child.once("error", (error) => {
      if (errorCode(error) === "ENOENT") {
        limiter.write("stderr", Buffer.from(`${request.argv[0] ?? ""}: not found\n`));
        exitCode = 127;
        finish();
      } else {
        finish(new WorkspaceError("backend_failure", `spawn failed: ${error.message}`));
      }
    });
    child.once("exit", (code, signalName) => {
      exitCode = code ?? (signalName === null ? -1 : 128 + (osConstants.signals[signalName] ?? 0));
      // Output still in the pipes arrives before "close"; a background process that holds
      // the pipes open must not hold the result, so stop waiting shortly after the exit.
      drainTimer = setTimeout(() => finish(), DRAIN_AFTER_EXIT_MS);
    });
    child.once("close", () => finish());
  });
}
