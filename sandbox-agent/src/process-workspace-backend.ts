// The process backend: a folder per workspace and child processes, for machines without
// Docker. WEAKER ISOLATION than the docker backend, and documented as such:
//   - without bubblewrap, a command runs as the agent's own user with the host's filesystem,
//     network, process table and no memory, pids or CPU limits; only its environment is
//     clean (the workspace env + the request env + PATH) and its process group is killed on
//     timeout, abort, exit and release. Use it for trusted workloads and development only.
//   - with bubblewrap (`bwrap` on PATH and working; detected at run time), each command runs
//     in new user, pid, ipc, uts, cgroup and network namespaces (network shared only when
//     the spec grants it), all capabilities dropped, with a read-only view of the system
//     folders, a private /tmp and /proc, and the workspace bound read-write at /workspace:
//     other workspaces and the host's files are not visible. Still no memory or pids limits.
//
// Folder layout under workspaceRoot, one folder per workspace:
//   <encoded id>/workspace.json   marker (workspaceId, runId, hostId): list() and reap() read it
//   <encoded id>/files/           the workspace itself (/workspace to commands under bwrap)
// The marker sits beside the files, not among them, so commands cannot rewrite it.
//
// This module also exports the host-folder helpers both backends use for file access
// (path rules, symlink-safe reads and writes, output truncation).
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { constants as fsConstants, type Stats } from "node:fs";
import { access, chmod, lstat, mkdir, open, readdir, readFile, readlink, realpath, rename, rm, unlink, writeFile as writeFileAtPath, type FileHandle } from "node:fs/promises";
import { constants as osConstants } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import {
  DEFAULT_WORKSPACE_LIMITS,
  WorkspaceError,
  type ExecRequest,
  type ExecResult,
  type FileEntry,
  type OutputStreamName,
  type WorkspaceBackend,
  type WorkspaceSpec,
  type WorkspaceSummary,
} from "./workspace-backend.js";

/** Where commands see the workspace (Docker, bubblewrap); the logical root of every path. */
export const WORKSPACE_MOUNT = "/workspace";

const MAX_LIST_ENTRIES = 10_000;

// ---------------------------------------------------------------------------------------
// Path rules and host-folder access (shared with docker-workspace-backend.ts)
// ---------------------------------------------------------------------------------------

/**
 * Splits a workspace path ("src/a.ts", "./src", "/workspace/src") into segments below
 * /workspace. Relative paths are relative to /workspace; absolute paths must be /workspace
 * or below it. Anything that leaves it lexically ("..", "/etc") is refused here; symlinks
 * that lead out are refused when the path is opened.
 */
export function workspaceSegments(p: string): string[] {
  if (p.includes("\0")) throw outside(p);
  let rest: string;
  if (p.startsWith("/")) {
    const normalized = path.posix.normalize(p);
    if (normalized === WORKSPACE_MOUNT || normalized === `${WORKSPACE_MOUNT}/`) rest = "";
    else if (normalized.startsWith(`${WORKSPACE_MOUNT}/`)) rest = normalized.slice(WORKSPACE_MOUNT.length + 1);
    else throw outside(p);
  } else {
    rest = p === "" ? "" : path.posix.normalize(p);
    if (rest === ".." || rest.startsWith("../")) throw outside(p);
  }
  return rest.split("/").filter((s) => s !== "" && s !== ".");
}

/** The sandbox path of some segments, as commands see it: /workspace/a/b. */
export function workspacePath(segments: readonly string[]): string {
  return segments.length === 0 ? WORKSPACE_MOUNT : `${WORKSPACE_MOUNT}/${segments.join("/")}`;
}

/**
 * An injective, file-name- and container-name-safe spelling of an id: [A-Za-z0-9-] stay,
 * every other UTF-8 byte becomes _HH. It never contains "." or "__", so names built from it
 * cannot be "..", hidden, or collide with the backends' own dot-prefixed folders.
 */
export function encodeId(id: string): string {
  if (id === "") throw new WorkspaceError("backend_failure", "empty id");
  let out = "";
  for (const byte of Buffer.from(id, "utf8")) {
    const c = String.fromCharCode(byte);
    out += /[A-Za-z0-9-]/.test(c) ? c : `_${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

function outside(p: string): WorkspaceError {
  return new WorkspaceError("path_outside_workspace", `path is outside /workspace: ${JSON.stringify(p)}`);
}

function errorCode(error: unknown): string | undefined {
  return typeof error === "object" && error !== null && "code" in error && typeof error.code === "string" ? error.code : undefined;
}

/** Owner for files the host creates in a workspace (the container user for Docker). */
export interface FolderOwner {
  readonly uid: number;
  readonly gid: number;
}

// Every walk below goes through /proc/self/fd/<fd>/<name>: the kernel resolves the name in
// the directory the descriptor holds (like openat), so a command that swaps a folder for a
// symlink between our check and our use cannot redirect the host into the host's own files.
// Directories are opened following symlinks and then checked by where the descriptor
// really is; names are created only inside a checked directory and never through symlinks.
const viaFd = (fd: number, name?: string): string => (name === undefined ? `/proc/self/fd/${fd}` : `/proc/self/fd/${fd}/${name}`);

async function assertInside(handle: FileHandle, rootReal: string, shown: string): Promise<void> {
  const where = await readlink(viaFd(handle.fd));
  if (where !== rootReal && !where.startsWith(`${rootReal}/`)) throw outside(shown);
}

async function openDirectory(parent: FileHandle, name: string): Promise<FileHandle> {
  return open(viaFd(parent.fd, name), fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
}

/** Opens the folder at `segments` below `folder`, checking each step stays inside it. */
async function walk(folder: string, segments: readonly string[], shown: string, create?: { owner: FolderOwner | undefined }): Promise<FileHandle> {
  const rootReal = await realpath(folder).catch((error: unknown) => {
    if (errorCode(error) === "ENOENT") throw new WorkspaceError("not_found", "workspace folder is gone");
    throw error;
  });
  let current = await open(rootReal, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    for (const segment of segments) {
      let next: FileHandle;
      try {
        next = await openDirectory(current, segment);
      } catch (error) {
        const code = errorCode(error);
        if (code === "ENOENT" && create !== undefined) {
          await mkdir(viaFd(current.fd, segment), { mode: 0o755 }).catch((e: unknown) => {
            if (errorCode(e) !== "EEXIST") throw e;
          });
          next = await open(viaFd(current.fd, segment), fsConstants.O_RDONLY | fsConstants.O_DIRECTORY | fsConstants.O_NOFOLLOW).catch((e: unknown) => {
            if (errorCode(e) === "ELOOP") throw outside(shown);
            throw e;
          });
          if (create.owner !== undefined) await next.chown(create.owner.uid, create.owner.gid);
        } else if (code === "ENOENT" || code === "ENOTDIR") {
          throw new WorkspaceError("not_found", `no such directory: ${shown}`);
        } else {
          throw error;
        }
      }
      await current.close();
      current = next;
      await assertInside(current, rootReal, shown);
    }
    return current;
  } catch (error) {
    await current.close();
    throw error;
  }
}

function wrapFsError(error: unknown, shown: string): never {
  if (error instanceof WorkspaceError) throw error;
  const code = errorCode(error);
  if (code === "ENOENT" || code === "ENOTDIR") throw new WorkspaceError("not_found", `not found: ${shown}`);
  if (code === "ELOOP") throw outside(shown);
  throw new WorkspaceError("backend_failure", `file access failed for ${shown}: ${error instanceof Error ? error.message : String(error)}`);
}

/** Checks a working directory: inside the workspace, existing, a directory. Returns its segments. */
export async function resolveWorkspaceDirectory(folder: string, p: string): Promise<string[]> {
  const segments = workspaceSegments(p);
  try {
    const handle = await walk(folder, segments, p);
    await handle.close();
  } catch (error) {
    wrapFsError(error, p);
  }
  return segments;
}

export async function readWorkspaceFile(folder: string, p: string, maxBytes: number): Promise<Uint8Array> {
  const segments = workspaceSegments(p);
  const name = segments.pop();
  if (name === undefined) throw new WorkspaceError("not_found", `not a file: ${p}`);
  try {
    const dir = await walk(folder, segments, p);
    let file: FileHandle;
    try {
      // O_NONBLOCK: a FIFO planted by a command must not hang the host.
      file = await open(viaFd(dir.fd, name), fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY);
    } finally {
      await dir.close();
    }
    try {
      await assertInside(file, await realpath(folder), p);
      const stats = await file.stat();
      if (!stats.isFile()) throw new WorkspaceError("not_found", `not a regular file: ${p}`);
      if (stats.size > maxBytes) throw new WorkspaceError("too_large", `${p} is ${stats.size} bytes; the limit is ${maxBytes}`);
      // Read at most maxBytes + 1: the file may grow while we read.
      const buffer = Buffer.alloc(Math.min(maxBytes + 1, Math.max(stats.size, 0) + 1));
      let total = 0;
      for (;;) {
        const { bytesRead } = await file.read(buffer, total, buffer.length - total, null);
        if (bytesRead === 0) break;
        total += bytesRead;
        if (total === buffer.length) {
          if (total > maxBytes) throw new WorkspaceError("too_large", `${p} is larger than ${maxBytes} bytes`);
          break;
        }
      }
      return new Uint8Array(buffer.buffer, buffer.byteOffset, total);
    } finally {
      await file.close();
    }
  } catch (error) {
    wrapFsError(error, p);
  }
}

/**
 * Writes atomically: a new file beside the target (O_CREAT|O_EXCL, so never through a
 * symlink), then rename over the target (rename replaces a symlink, never follows it).
 * Parent folders are created. An existing regular file keeps its permission bits.
 */
export async function writeWorkspaceFile(folder: string, p: string, content: Uint8Array, owner?: FolderOwner): Promise<void> {
  const segments = workspaceSegments(p);
  const name = segments.pop();
  if (name === undefined) throw new WorkspaceError("path_outside_workspace", `not a file path: ${p}`);
  try {
    const dir = await walk(folder, segments, p, { owner });
    try {
      let mode = 0o644;
      const existing = await lstat(viaFd(dir.fd, name)).catch((e: unknown) => (errorCode(e) === "ENOENT" ? undefined : Promise.reject(e)));
      if (existing?.isDirectory()) throw new WorkspaceError("backend_failure", `is a directory: ${p}`);
      if (existing?.isFile()) mode = existing.mode & 0o777;
      const temporary = `.keel-write-${randomUUID()}`;
      const file = await open(viaFd(dir.fd, temporary), fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW, mode);
      try {
        if (owner !== undefined) await file.chown(owner.uid, owner.gid);
        await file.chmod(mode);
        await file.writeFile(content);
      } catch (error) {
        await file.close();
        await unlink(viaFd(dir.fd, temporary)).catch(() => undefined);
        throw error;
      }
      await file.close();
      await rename(viaFd(dir.fd, temporary), viaFd(dir.fd, name)).catch(async (error: unknown) => {
        await unlink(viaFd(dir.fd, temporary)).catch(() => undefined);
        throw error;
      });
    } finally {
      await dir.close();
    }
  } catch (error) {
    wrapFsError(error, p);
  }
}

/** One level of a folder, sorted by name; symlinks are reported as "other" and not followed. */
export async function listWorkspaceFiles(folder: string, p: string): Promise<FileEntry[]> {
  const segments = workspaceSegments(p);
  try {
    const dir = await walk(folder, segments, p);
    try {
      const names = (await readdir(viaFd(dir.fd))).sort();
      if (names.length > MAX_LIST_ENTRIES) throw new WorkspaceError("too_large", `${p} has ${names.length} entries; the limit is ${MAX_LIST_ENTRIES}`);
      const entries: FileEntry[] = [];
      for (const name of names) {
        let stats: Stats;
        try {
          stats = await lstat(viaFd(dir.fd, name));
        } catch {
          continue; // removed meanwhile
        }
        entries.push({
          path: workspacePath([...segments, name]),
          type: stats.isFile() ? "file" : stats.isDirectory() ? "directory" : "other",
          sizeBytes: stats.isFile() ? stats.size : 0,
        });
      }
      return entries;
    } finally {
      await dir.close();
    }
  } catch (error) {
    wrapFsError(error, p);
  }
}

/** Removes a folder tree; if a command made parts of it read-only, makes them writable first. */
export async function removeTree(folder: string): Promise<void> {
  try {
    await rm(folder, { recursive: true, force: true, maxRetries: 2 });
  } catch (error) {
    if (errorCode(error) !== "EACCES" && errorCode(error) !== "EPERM") throw error;
    const makeWritable = async (dir: string): Promise<void> => {
      await chmod(dir, 0o700).catch(() => undefined);
      for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
        if (entry.isDirectory()) await makeWritable(path.join(dir, entry.name));
      }
    };
    await makeWritable(folder);
    await rm(folder, { recursive: true, force: true });
  }
}

/** Writes a small JSON file atomically (temporary file and rename). */
export async function writeJsonAtomically(file: string, value: unknown): Promise<void> {
  const temporary = `${file}.${randomUUID()}.tmp`;
  await writeFileAtPath(temporary, `${JSON.stringify(value)}\n`, { mode: 0o600 });
  await rename(temporary, file);
}

/** Forwards output until `maxBytes` (both streams together), then drops and marks truncation. */
export interface OutputLimiter {
  write(stream: OutputStreamName, chunk: Uint8Array): void;
  readonly truncated: boolean;
  readonly forwardedBytes: number;
}

export function createOutputLimiter(maxBytes: number, onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void): OutputLimiter {
  let forwarded = 0;
  let truncated = false;
  return {
    write(stream, chunk) {
      if (chunk.length === 0) return;
      const room = Math.max(0, maxBytes - forwarded);
      if (chunk.length > room) truncated = true;
      if (room === 0) return;
      const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
      forwarded += part.length;
      onOutput(stream, part);
    },
    get truncated() {
      return truncated;
    },
    get forwardedBytes() {
      return forwarded;
    },
  };
}

/** Validates and merges environments: later ones win. Names must be non-empty, without "=" or NUL. */
export function mergeEnv(...sources: readonly Readonly<Record<string, string>>[]): Record<string, string> {
  const merged: Record<string, string> = {};
  for (const source of sources) {
    for (const [key, value] of Object.entries(source)) {
      if (key === "" || key.includes("=") || key.includes("\0") || value.includes("\0")) {
        throw new WorkspaceError("backend_failure", `invalid environment variable ${JSON.stringify(key)}`);
      }
      merged[key] = value;
    }
  }
  return merged;
}

// ---------------------------------------------------------------------------------------
// bubblewrap detection
// ---------------------------------------------------------------------------------------

const SYSTEM_FOLDERS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"];
// Only what programs need from /etc: not /etc as a whole (it may hold host secrets, and
// inside the sandbox the command's uid can map to the agent's own).
const ETC_FILES = [
  "/etc/passwd",
  "/etc/group",
  "/etc/nsswitch.conf",
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/alternatives",
  "/etc/localtime",
  "/etc/ssl",
  "/etc/ca-certificates",
  "/etc/hosts",
];

interface Bubblewrap {
  readonly binary: string;
  /** Binds of the system folders, computed once. */
  readonly systemArgs: readonly string[];
  readonly supportsSize: boolean;
}

let bubblewrapProbe: Promise<Bubblewrap | undefined> | undefined;

async function findOnPath(binary: string): Promise<string | undefined> {
  for (const dir of (process.env.PATH ?? "/usr/bin:/bin").split(":")) {
    if (dir === "") continue;
    const candidate = path.join(dir, binary);
    try {
      await access(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

async function systemBindArgs(): Promise<string[]> {
  const args: string[] = [];
  for (const folder of SYSTEM_FOLDERS) {
    const stats = await lstat(folder).catch(() => undefined);
    if (stats === undefined) continue;
    if (stats.isSymbolicLink()) args.push("--symlink", await readlink(folder), folder);
    else if (stats.isDirectory()) args.push("--ro-bind", folder, folder);
  }
  for (const file of ETC_FILES) args.push("--ro-bind-try", file, file);
  return args;
}

function runQuietly(binary: string, args: readonly string[], timeoutMs: number): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin" } });
    let output = "";
    const keep = (chunk: Buffer): void => {
      if (output.length < 65_536) output += chunk.toString("utf8");
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("error", () => {
      clearTimeout(timer);
      resolve({ code: null, output });
    });
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

/** Whether bubblewrap is installed and can make the sandbox this backend needs (cached). */
export function detectBubblewrap(): Promise<boolean> {
  return probeBubblewrap().then((b) => b !== undefined);
}

function probeBubblewrap(): Promise<Bubblewrap | undefined> {
  bubblewrapProbe ??= (async () => {
    const binary = await findOnPath("bwrap");
    if (binary === undefined) return undefined;
    const systemArgs = await systemBindArgs();
    const help = await runQuietly(binary, ["--help"], 5_000);
    const supportsSize = help.output.includes("--size");
    const probe = await runQuietly(
      binary,
      ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", ...systemArgs, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "sh", "-c", "exit 0"],
      5_000,
    );
    return probe.code === 0 ? { binary, systemArgs, supportsSize } : undefined;
  })();
  return bubblewrapProbe;
}

// ---------------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------------

export interface ProcessWorkspaceBackendOptions {
  /** Host folder holding one folder per workspace. */
  readonly workspaceRoot: string;
  readonly hostId: string;
  readonly log?: (msg: string) => void;
  /**
   * "auto" (the default): bubblewrap when it is installed and works, plain child processes
   * otherwise. "bubblewrap": refuse to run without it. "none": plain child processes.
   */
  readonly sandbox?: "auto" | "bubblewrap" | "none";
}

interface Marker {
  readonly workspaceId: string;
  readonly runId: string;
  readonly hostId: string;
  readonly networkAccess: boolean;
  readonly tmpfsBytes: number;
}

interface ProcessWorkspace {
  readonly marker: Marker;
  readonly folder: string;
  readonly files: string;
  /** Granted env; in memory only, never written to disk. Empty for a workspace found on disk but not (re)acquired. */
  readonly env: Readonly<Record<string, string>>;
  readonly running: Set<{ kill(): void }>;
}

const MARKER = "workspace.json";
const FILES = "files";
/** After the main process exits, how long to wait for output still in its pipes. */
const DRAIN_AFTER_EXIT_MS = 200;

export function createProcessWorkspaceBackend(options: ProcessWorkspaceBackendOptions): WorkspaceBackend {
  const log = options.log ?? (() => undefined);
  const mode = options.sandbox ?? "auto";
  const root = path.resolve(options.workspaceRoot);
  const workspaces = new Map<string, ProcessWorkspace>();
  const inflight = new Map<string, Promise<void>>();
  let closed = false;

  const folderOf = (workspaceId: string): string => path.join(root, encodeId(workspaceId));

  async function sandbox(): Promise<Bubblewrap | undefined> {
    if (mode === "none") return undefined;
    const found = await probeBubblewrap();
    if (found === undefined && mode === "bubblewrap") throw new WorkspaceError("backend_failure", "bubblewrap (bwrap) is required but not usable on this host");
    return found;
  }

  async function readMarker(folder: string): Promise<Marker | undefined> {
    try {
      const parsed = JSON.parse(await readFile(path.join(folder, MARKER), "utf8")) as Partial<Marker>;
      if (typeof parsed.workspaceId !== "string" || typeof parsed.runId !== "string" || typeof parsed.hostId !== "string") return undefined;
      return {
        workspaceId: parsed.workspaceId,
        runId: parsed.runId,
        hostId: parsed.hostId,
        networkAccess: parsed.networkAccess === true,
        tmpfsBytes: typeof parsed.tmpfsBytes === "number" ? parsed.tmpfsBytes : DEFAULT_WORKSPACE_LIMITS.tmpfsBytes,
      };
    } catch {
      return undefined;
    }
  }

  async function find(workspaceId: string): Promise<ProcessWorkspace> {
    const known = workspaces.get(workspaceId);
    if (known !== undefined) return known;
    const folder = folderOf(workspaceId);
    const marker = await readMarker(folder);
    if (marker === undefined || marker.hostId !== options.hostId || marker.workspaceId !== workspaceId) {
      throw new WorkspaceError("not_found", `no workspace ${workspaceId}`);
    }
    // Found on disk (an earlier agent process made it): usable, but the granted env lives in
    // memory only, so it is empty until the control plane acquires the workspace again.
    log(`process workspace ${workspaceId} found on disk; its env is empty until it is acquired again`);
    const workspace: ProcessWorkspace = { marker, folder, files: path.join(folder, FILES), env: {}, running: new Set() };
    workspaces.set(workspaceId, workspace);
    return workspace;
  }

  async function acquireNow(spec: WorkspaceSpec, signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    await sandbox();
    const folder = folderOf(spec.workspaceId);
    await mkdir(root, { recursive: true, mode: 0o700 });
    await mkdir(path.join(folder, FILES), { recursive: true, mode: 0o700 });
    const marker: Marker = {
      workspaceId: spec.workspaceId,
      runId: spec.runId,
      hostId: options.hostId,
      networkAccess: spec.networkAccess,
      tmpfsBytes: spec.limits.tmpfsBytes,
    };
    const existing = await readMarker(folder);
    if (existing === undefined || existing.runId !== marker.runId || existing.hostId !== marker.hostId || existing.networkAccess !== marker.networkAccess || existing.tmpfsBytes !== marker.tmpfsBytes) {
      await writeJsonAtomically(path.join(folder, MARKER), marker);
    }
    const previous = workspaces.get(spec.workspaceId);
    workspaces.set(spec.workspaceId, {
      marker,
      folder,
      files: path.join(folder, FILES),
      env: { ...spec.env },
      running: previous?.running ?? new Set(),
    });
  }

  async function removeWorkspace(workspaceId: string, folder: string): Promise<void> {
    const workspace = workspaces.get(workspaceId);
    workspaces.delete(workspaceId);
    for (const run of workspace?.running ?? []) run.kill();
    await removeTree(folder);
  }

  async function execute(
    workspace: ProcessWorkspace,
    request: ExecRequest,
    onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void,
    signal: AbortSignal,
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
      args = [
        "--unshare-all",
        ...(workspace.marker.networkAccess ? ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"] : []),
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        ...bwrap.systemArgs,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        ...(bwrap.supportsSize ? ["--size", String(workspace.marker.tmpfsBytes)] : []),
        "--tmpfs",
        "/tmp",
        "--bind",
        workspace.files,
        WORKSPACE_MOUNT,
        "--chdir",
        workspacePath(segments),
        "--",
        ...request.argv,
      ];
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
      const finish = (error?: unknown): void => {
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

  return {
    name: "process",

    async acquire(spec, signal) {
      if (closed) throw new WorkspaceError("backend_failure", "backend is closed");
      const pending = inflight.get(spec.workspaceId);
      if (pending !== undefined) return pending;
      const promise = acquireNow(spec, signal).finally(() => inflight.delete(spec.workspaceId));
      inflight.set(spec.workspaceId, promise);
      return promise;
    },

    async exec(workspaceId, request, onOutput, signal) {
      return execute(await find(workspaceId), request, onOutput, signal);
    },

    async readFile(workspaceId, p, maxBytes) {
      return readWorkspaceFile((await find(workspaceId)).files, p, maxBytes);
    },

    async writeFile(workspaceId, p, content) {
      await writeWorkspaceFile((await find(workspaceId)).files, p, content);
    },

    async listFiles(workspaceId, p) {
      return listWorkspaceFiles((await find(workspaceId)).files, p);
    },

    async release(workspaceId) {
      const folder = folderOf(workspaceId);
      const marker = await readMarker(folder);
      if (marker !== undefined && marker.hostId !== options.hostId) return;
      await removeWorkspace(workspaceId, folder);
    },

    async list() {
      const found: WorkspaceSummary[] = [];
      for (const name of await readdir(root).catch(() => [] as string[])) {
        const marker = await readMarker(path.join(root, name));
        if (marker !== undefined && marker.hostId === options.hostId && encodeId(marker.workspaceId) === name) {
          found.push({ workspaceId: marker.workspaceId, runId: marker.runId });
        }
      }
      return found;
    },

    async reap(keep) {
      const removed: string[] = [];
      for (const name of await readdir(root).catch(() => [] as string[])) {
        const folder = path.join(root, name);
        const marker = await readMarker(folder);
        if (marker === undefined || marker.hostId !== options.hostId || encodeId(marker.workspaceId) !== name) continue;
        if (keep(marker.workspaceId)) continue;
        await removeWorkspace(marker.workspaceId, folder);
        removed.push(marker.workspaceId);
      }
      return removed;
    },

    async close() {
      closed = true;
      await Promise.allSettled(inflight.values());
      // Commands die with the backend; workspace folders stay for the next agent process.
      for (const workspace of workspaces.values()) for (const run of workspace.running) run.kill();
      workspaces.clear();
    },
  };
}

