// The docker backend: one hardened container per workspace, commands through docker exec.
//
// Hardened by default (every container, warm or cold): user 10001:10001, all capabilities
// dropped, no-new-privileges, a read-only root filesystem, docker-init as PID 1 (reaps
// orphans), a writable bind mount of the workspace's host folder at /workspace, a size-limited
// noexec /tmp tmpfs, pids, memory (no swap) and CPU limits, no network unless the spec grants
// it, and labels keel.workspace-id, keel.host-id, keel.run-id, keel.managed.
//
// Secrets never enter the container's configuration: the workspace env is held in this
// process's memory and passed to each exec, so `docker inspect` does not show it and warm
// containers serve any spec. After an agent restart, acquire the workspace again (idempotent)
// to re-arm its env.
//
// Warm pool. Docker labels are fixed at creation, so a pool container cannot be relabelled
// with the workspace id it will serve. Pool containers are created with a fresh pool id as
// keel.workspace-id (and keel.warm=true, keel.run-id ""), and a folder of their own,
// <workspaceRoot>/.warm-<uuid>. Every workspace, warm or cold, has an assignment record,
// <workspaceRoot>/.keel-records/<encoded workspace id>.json {workspaceId, runId, containerId,
// folder}, written atomically, host-side and outside every mount (commands cannot forge it):
// when a warm container is taken, or before a cold one (named keel__<host>__<workspace>) is
// created. Records are what make a warm container a workspace: list() and reap() read them
// first and labels second, so assignments survive agent restarts, and acquiring a warm
// container costs one local file write, no engine round trip. The folder is not renamed: a
// restart of the container (see Exec) must find its bind-mount source where it was. A pool
// serves specs with its image, no network and its limits (tmpfs size and network mode cannot
// change after creation); other specs are created cold. The pool refills in the background,
// one container at a time per image; close() removes idle pool containers, and reap()
// removes idle pool containers an earlier agent process left.
//
// Exec. Each command runs as `sh -c WRAPPER marker secs argv...` (see WRAPPER): the shell is
// the exec's session leader; it runs the command under the image's `timeout -s KILL` and, when
// the command ends, kills whatever it left running in its session (a command's processes end
// with it, as in the process backend; a command that wants a daemon must setsid it, and it
// still dies at release). The attach stream is demultiplexed by hand (8-byte frame headers)
// into stdout and stderr chunks forwarded as they arrive, counted against maxOutputBytes; past
// the cap, output is drained and dropped, so the command never blocks on a full pipe and
// memory stays bounded. On timeout or abort the host stops waiting at once and kills the
// session with a second exec that finds the wrapper by its marker (shell builtins only: one
// free pid suffices). When even that cannot run (a fork bomb holds every pid), the
// in-container timeout fires a second later and the wrapper cleans up without forking; if the
// command still runs after that, the backend kills the container (all its processes) and
// starts it again: files in /workspace persist, /tmp is emptied.
//
// release() removes the container and the folder at once. Keeping a finished run's workspace
// for inspection is the control plane's decision: it calls release when the retention ends.
import { randomUUID } from "node:crypto";
import { chown, mkdir, readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { performance } from "node:perf_hooks";
import type { Duplex } from "node:stream";
import Dockerode from "dockerode";
import {
  createOutputLimiter,
  encodeId,
  listWorkspaceFiles,
  mergeEnv,
  readWorkspaceFile,
  removeTree,
  resolveWorkspaceDirectory,
  workspacePath,
  writeJsonAtomically,
  writeWorkspaceFile,
  type FolderOwner,
} from "./process-workspace-backend.js";
import {
  DEFAULT_WORKSPACE_LIMITS,
  WorkspaceError,
  type ExecRequest,
  type ExecResult,
  type OutputStreamName,
  type WorkspaceBackend,
  type WorkspaceLimits,
  type WorkspaceSpec,
  type WorkspaceSummary,
} from "./workspace-backend.js";

/** The unprivileged user every workspace container runs as; owns the workspace folders. */
export const SANDBOX_USER: FolderOwner = { uid: 10001, gid: 10001 };

export const LABELS = {
  workspaceId: "keel.workspace-id",
  hostId: "keel.host-id",
  runId: "keel.run-id",
  managed: "keel.managed",
  warm: "keel.warm",
} as const;

export interface WarmPoolOptions {
  readonly image: string;
  readonly size: number;
  /** Limits of the pool's containers; specs with other limits are created cold. Default: DEFAULT_WORKSPACE_LIMITS. */
  readonly limits?: WorkspaceLimits;
}

export interface DockerWorkspaceBackendOptions {
  readonly docker?: Dockerode;
  readonly hostId: string;
  /** Host folder for the bind mounts, e.g. <data>/workspaces. Must be on the Docker engine's host. */
  readonly workspaceRoot: string;
  readonly warmPool?: readonly WarmPoolOptions[];
  readonly log?: (msg: string) => void;
}

export interface WarmPoolStatus {
  readonly image: string;
  readonly size: number;
  readonly idle: number;
}

/** The port plus what operators, tests and benchmarks can observe of the warm pool. */
export interface DockerWorkspaceBackend extends WorkspaceBackend {
  readonly name: "docker";
  poolStatus(): readonly WarmPoolStatus[];
  /** Resolves when no pool is refilling (full, closed, or a refill failed and was logged). */
  poolsFilled(): Promise<void>;
}

interface Assignment {
  readonly workspaceId: string;
  readonly runId: string;
  readonly hostId: string;
  /** The container's id (warm) or name (cold: the record is written before the container exists); Docker takes either. */
  readonly containerId: string;
  /** Folder name under workspaceRoot. */
  readonly folder: string;
}

interface LiveWorkspace extends Assignment {
  /** Granted env; in memory only. */
  readonly env: Readonly<Record<string, string>>;
}

interface PoolSlot {
  readonly containerId: string;
  readonly folder: string;
}

interface WarmPool {
  readonly image: string;
  readonly size: number;
  readonly limits: WorkspaceLimits;
  readonly idle: PoolSlot[];
  filling: Promise<void> | undefined;
}

const RECORDS = ".keel-records";
const KILL_EXEC_TIMEOUT_MS = 2_000;
const KILL_GRACE_MS = 1_500;

// Kills every process of session $p except $me, with shell builtins only (no fork), so it
// works when a fork bomb holds every pid. A /proc/<pid>/stat line is "pid (comm) state ppid
// pgrp session ..."; comm may hold spaces and parentheses, hence the strip to the last ") ".
const KILL_SESSION = [
  "for d in /proc/[0-9]*; do",
  '  read -r l 2>/dev/null <"$d/stat" || continue',
  "  set -- ${l##*) }",
  '  [ "$4" = "$p" ] && [ "${d#/proc/}" != "$me" ] && kill -KILL "${d#/proc/}" 2>/dev/null',
  "done",
].join("\n");

// The exec's command: $0 = a marker unique to the exec, $1 = seconds for the in-container
// timeout, then argv. The shell is the exec's session leader (runc makes every exec one); it
// runs the command under the image's `timeout -s KILL` (whose watcher is forked up front, so
// it fires even when a fork bomb holds every pid) and, when the command ends, by itself or by
// that timeout, kills what the command left behind in its session.
const WRAPPER = [
  "s=$1; shift",
  'if command -v timeout >/dev/null 2>&1; then timeout -s KILL "$s" "$@"; else "$@"; fi',
  "r=$?",
  "p=$$; me=$$",
  KILL_SESSION,
  "exit $r",
].join("\n");

// The host's kill for a command past its timeout or aborted: $0 = the exec's marker. Finds the
// wrapper by the marker in its command line (read drops the NULs), then kills its process
// group and its whole session (GNU timeout moves the command into a group of its own).
const KILLER = [
  "m=$0; me=$$; p=",
  "for d in /proc/[0-9]*; do",
  '  [ "${d#/proc/}" = "$me" ] && continue',
  // cmdline holds the wrapper script's newlines: join every line.
  '  l=; while IFS= read -r x || [ -n "$x" ]; do l="$l$x"; x=; done 2>/dev/null <"$d/cmdline"',
  '  case "$l" in *"$m"*) p=${d#/proc/}; break ;; esac',
  "done",
  '[ -n "$p" ] || exit 3',
  'kill -KILL -"$p" 2>/dev/null',
  KILL_SESSION,
  "exit 0",
].join("\n");

function statusCode(error: unknown): number | undefined {
  return typeof error === "object" && error !== null && "statusCode" in error && typeof error.statusCode === "number" ? error.statusCode : undefined;
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function failure(what: string, error: unknown): WorkspaceError {
  if (error instanceof WorkspaceError) return error;
  const wrapped = new WorkspaceError("backend_failure", `${what}: ${message(error)}`);
  wrapped.cause = error;
  return wrapped;
}

const WARM_ID = /^warm-[0-9a-f-]{36}$/;

/** A folder name this backend made: an encoded workspace id or ".warm-<uuid>". */
function isOwnFolderName(folder: string): boolean {
  return /^[A-Za-z0-9_-]+$/.test(folder) || (folder.startsWith(".") && WARM_ID.test(folder.slice(1)));
}

function sameLimits(a: WorkspaceLimits, b: WorkspaceLimits): boolean {
  return a.memoryBytes === b.memoryBytes && a.nanoCpus === b.nanoCpus && a.pids === b.pids && a.tmpfsBytes === b.tmpfsBytes;
}

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

/**
 * The create options of a workspace container: an unprivileged user, no capabilities, no new
 * privileges, a read-only root with the workspace folder bind-mounted and a noexec /tmp, pids,
 * memory (no swap) and CPU limits, no network unless granted, and the labels a reaper finds it
 * by. Exported so the sandbox benchmark's cold baseline creates exactly this container.
 */
export function hardenedContainerConfig(args: {
  readonly image: string;
  readonly limits: WorkspaceLimits;
  readonly networkAccess: boolean;
  /** The host folder mounted at /workspace. */
  readonly hostFolder: string;
  readonly hostId: string;
  readonly workspaceLabel: string;
  readonly runId: string;
  readonly warm: boolean;
}): Dockerode.ContainerCreateOptions {
  return {
    Image: args.image,
    // The container only idles; commands arrive through docker exec.
    Entrypoint: ["sleep", "2147483647"],
    Cmd: [],
    WorkingDir: "/workspace",
    User: `${SANDBOX_USER.uid}:${SANDBOX_USER.gid}`,
    Env: [],
    Labels: {
      [LABELS.workspaceId]: args.workspaceLabel,
      [LABELS.hostId]: args.hostId,
      [LABELS.runId]: args.runId,
      [LABELS.managed]: "true",
      ...(args.warm ? { [LABELS.warm]: "true" } : {}),
    },
    HostConfig: {
      Init: true,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges"],
      ReadonlyRootfs: true,
      Mounts: [{ Type: "bind", Source: args.hostFolder, Target: "/workspace", ReadOnly: false }],
      Tmpfs: { "/tmp": `rw,noexec,nosuid,nodev,size=${args.limits.tmpfsBytes}` },
      PidsLimit: args.limits.pids,
      Memory: args.limits.memoryBytes,
      MemorySwap: args.limits.memoryBytes,
      NanoCpus: args.limits.nanoCpus,
      NetworkMode: args.networkAccess ? "bridge" : "none",
      RestartPolicy: { Name: "no" },
    },
  };
}

/** Parses Docker's multiplexed attach stream: [type, 0, 0, 0, size(4, big-endian)] + payload. */
export function createDemuxer(emit: (stream: OutputStreamName, chunk: Uint8Array) => void): (chunk: Buffer) => void {
  const header = Buffer.alloc(8);
  let headerBytes = 0;
  let remaining = 0;
  let stream: OutputStreamName = "stdout";
  return (chunk) => {
    let offset = 0;
    while (offset < chunk.length) {
      if (remaining === 0) {
        const n = Math.min(8 - headerBytes, chunk.length - offset);
        chunk.copy(header, headerBytes, offset, offset + n);
        headerBytes += n;
        offset += n;
        if (headerBytes === 8) {
          // 0 (stdin, written on stdout) and 1: stdout; 2 (and 3, the engine's own errors): stderr.
          stream = header[0] === 0 || header[0] === 1 ? "stdout" : "stderr";
          remaining = header.readUInt32BE(4);
          headerBytes = 0;
        }
        continue;
      }
      const n = Math.min(remaining, chunk.length - offset);
      emit(stream, chunk.subarray(offset, offset + n));
      offset += n;
      remaining -= n;
    }
  };
}

export function createDockerWorkspaceBackend(options: DockerWorkspaceBackendOptions): DockerWorkspaceBackend {
  const docker = options.docker ?? new Dockerode();
  const log = options.log ?? (() => undefined);
  const root = path.resolve(options.workspaceRoot);
  const recordsDir = path.join(root, RECORDS);
  const hostFilter = [`${LABELS.hostId}=${options.hostId}`, `${LABELS.managed}=true`];
  const workspaces = new Map<string, LiveWorkspace>();
  const inflight = new Map<string, Promise<void>>();
  /** Pool ids this process created; idle pool containers of earlier processes are reaped. */
  const ownPoolIds = new Set<string>();
  const pools: WarmPool[] = (options.warmPool ?? [])
    .filter((p) => p.size > 0)
    .map((p) => ({ image: p.image, size: p.size, limits: p.limits ?? DEFAULT_WORKSPACE_LIMITS, idle: [], filling: undefined }));
  let closed = false;
  let rootReady: Promise<void> | undefined;

  const recordFile = (workspaceId: string): string => path.join(recordsDir, `${encodeId(workspaceId)}.json`);
  const folderPath = (folder: string): string => path.join(root, folder);

  function ensureRoot(): Promise<void> {
    rootReady ??= (async () => {
      await mkdir(root, { recursive: true, mode: 0o700 });
      await mkdir(recordsDir, { recursive: true, mode: 0o700 });
    })().catch((error: unknown) => {
      rootReady = undefined;
      throw error;
    });
    return rootReady;
  }

  async function createContainer(args: {
    image: string;
    limits: WorkspaceLimits;
    networkAccess: boolean;
    folder: string;
    workspaceLabel: string;
    runId: string;
    warm: boolean;
    name?: string;
  }): Promise<string> {
    await ensureRoot();
    const hostFolder = folderPath(args.folder);
    await mkdir(hostFolder, { recursive: true, mode: 0o700 });
    await chown(hostFolder, SANDBOX_USER.uid, SANDBOX_USER.gid);
    const container = await docker.createContainer({
      ...(args.name === undefined ? {} : { name: args.name }),
      ...hardenedContainerConfig({ ...args, hostId: options.hostId, hostFolder }),
    });
    try {
      await container.start();
    } catch (error) {
      await container.remove({ force: true }).catch(() => undefined);
      throw error;
    }
    return container.id;
  }

  async function removeContainer(containerId: string): Promise<void> {
    try {
      await docker.getContainer(containerId).remove({ force: true });
    } catch (error) {
      if (statusCode(error) !== 404) throw error;
    }
  }

  async function ensureRunning(containerId: string): Promise<void> {
    const info = await docker.getContainer(containerId).inspect();
    if (!info.State.Running) await docker.getContainer(containerId).start();
  }

  // ----- warm pool -----

  function refill(pool: WarmPool): void {
    if (pool.filling !== undefined || closed) return;
    pool.filling = (async () => {
      try {
        while (!closed && pool.idle.length < pool.size) {
          const poolId = `warm-${randomUUID()}`;
          ownPoolIds.add(poolId);
          const folder = `.${poolId}`;
          const containerId = await createContainer({
            image: pool.image,
            limits: pool.limits,
            networkAccess: false,
            folder,
            workspaceLabel: poolId,
            runId: "",
            warm: true,
          });
          if (closed) {
            await removeContainer(containerId);
            await removeTree(folderPath(folder));
            break;
          }
          pool.idle.push({ containerId, folder });
        }
      } catch (error) {
        log(`warm pool for ${pool.image}: refill failed: ${message(error)}`);
      } finally {
        pool.filling = undefined;
      }
    })();
  }

  for (const pool of pools) refill(pool);

  function poolFor(spec: WorkspaceSpec): WarmPool | undefined {
    if (spec.networkAccess) return undefined;
    return pools.find((p) => p.image === spec.image && sameLimits(p.limits, spec.limits));
  }

  // ----- lookup -----

  async function readRecord(file: string): Promise<Assignment | undefined> {
    try {
      const parsed = JSON.parse(await readFile(file, "utf8")) as Partial<Assignment>;
      if (
        typeof parsed.workspaceId !== "string" ||
        typeof parsed.runId !== "string" ||
        typeof parsed.hostId !== "string" ||
        typeof parsed.containerId !== "string" ||
        typeof parsed.folder !== "string" ||
        !isOwnFolderName(parsed.folder)
      ) {
        return undefined;
      }
      if (parsed.hostId !== options.hostId) return undefined;
      return { workspaceId: parsed.workspaceId, runId: parsed.runId, hostId: parsed.hostId, containerId: parsed.containerId, folder: parsed.folder };
    } catch {
      return undefined;
    }
  }

  async function readRecords(): Promise<Assignment[]> {
    const records: Assignment[] = [];
    for (const name of await readdir(recordsDir).catch(() => [] as string[])) {
      if (!name.endsWith(".json")) continue;
      const record = await readRecord(path.join(recordsDir, name));
      if (record !== undefined && `${encodeId(record.workspaceId)}.json` === name) records.push(record);
    }
    return records;
  }

  async function listManaged(): Promise<Dockerode.ContainerInfo[]> {
    return docker.listContainers({ all: true, filters: { label: hostFilter } });
  }

  async function readOwnRecord(workspaceId: string): Promise<Assignment | undefined> {
    const record = await readRecord(recordFile(workspaceId));
    return record?.workspaceId === workspaceId ? record : undefined;
  }

  /** The record for a listed container: records name warm containers by id, cold ones by name. */
  function recordOf(container: Dockerode.ContainerInfo, records: readonly Assignment[]): Assignment | undefined {
    const refs = new Set([container.Id, ...container.Names.map((n) => n.replace(/^\//, ""))]);
    return records.find((r) => refs.has(r.containerId));
  }

  const coldName = (workspaceId: string): string => `keel__${encodeId(options.hostId)}__${encodeId(workspaceId)}`;

  /** Finds a workspace made by this or an earlier agent process: record first, label second. */
  async function findPersisted(workspaceId: string): Promise<Assignment | undefined> {
    const record = await readOwnRecord(workspaceId);
    if (record !== undefined) return record;
    const labelled = await docker.listContainers({ all: true, filters: { label: [...hostFilter, `${LABELS.workspaceId}=${workspaceId}`] } });
    const container = labelled.find((c) => c.Labels[LABELS.warm] !== "true");
    if (container === undefined) return undefined;
    return { workspaceId, runId: container.Labels[LABELS.runId] ?? "", hostId: options.hostId, containerId: container.Id, folder: encodeId(workspaceId) };
  }

  async function resolve(workspaceId: string): Promise<LiveWorkspace> {
    const live = workspaces.get(workspaceId);
    if (live !== undefined) return live;
    let found: Assignment | undefined;
    try {
      found = await findPersisted(workspaceId);
    } catch (error) {
      throw failure("workspace lookup failed", error);
    }
    if (found === undefined) throw new WorkspaceError("not_found", `no workspace ${workspaceId}`);
    log(`docker workspace ${workspaceId} found from an earlier agent process; its env is empty until it is acquired again`);
    const workspace: LiveWorkspace = { ...found, env: {} };
    workspaces.set(workspaceId, workspace);
    return workspace;
  }

  // ----- acquire -----

  async function acquireNow(spec: WorkspaceSpec, signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    const live = workspaces.get(spec.workspaceId);
    if (live !== undefined) {
      workspaces.set(spec.workspaceId, { ...live, env: { ...spec.env } });
      return;
    }
    await ensureRoot();
    // Only the local record is consulted here (no engine round trip before a warm take): every
    // container this backend assigns has its record written first (cold) or at once (warm).
    const persisted = await readOwnRecord(spec.workspaceId);
    let folder = encodeId(spec.workspaceId);
    if (persisted !== undefined) {
      try {
        await ensureRunning(persisted.containerId);
        workspaces.set(spec.workspaceId, { ...persisted, env: { ...spec.env } });
        return;
      } catch (error) {
        if (statusCode(error) !== 404) throw error;
        // The container went away behind our back: make a new one over the same folder.
        log(`workspace ${spec.workspaceId}: container ${persisted.containerId} is gone; creating another over its folder`);
        folder = persisted.folder;
      }
    } else {
      const pool = poolFor(spec);
      const slot = pool?.idle.shift();
      if (pool !== undefined && slot !== undefined) {
        const assignment: Assignment = { workspaceId: spec.workspaceId, runId: spec.runId, hostId: options.hostId, containerId: slot.containerId, folder: slot.folder };
        try {
          await writeJsonAtomically(recordFile(spec.workspaceId), assignment);
        } catch (error) {
          pool.idle.unshift(slot);
          throw error;
        }
        workspaces.set(spec.workspaceId, { ...assignment, env: { ...spec.env } });
        // Refill after the take, so the refill's work does not slow the acquisition down.
        refill(pool);
        return;
      }
      if (pool !== undefined) refill(pool);
    }
    signal.throwIfAborted();
    // Cold: the record (naming the container by its name) is written before the container is
    // created, so a crash in between leaves a record that the next acquire or reap resolves.
    // The name also makes creation idempotent across agent processes: a second create conflicts.
    const name = coldName(spec.workspaceId);
    const assignment: Assignment = { workspaceId: spec.workspaceId, runId: spec.runId, hostId: options.hostId, containerId: name, folder };
    await writeJsonAtomically(recordFile(spec.workspaceId), assignment);
    try {
      await createContainer({
        image: spec.image,
        limits: spec.limits,
        networkAccess: spec.networkAccess,
        folder,
        workspaceLabel: spec.workspaceId,
        runId: spec.runId,
        warm: false,
        name,
      });
    } catch (error) {
      if (statusCode(error) !== 409) {
        await rm(recordFile(spec.workspaceId), { force: true });
        throw error;
      }
      const info = await docker.getContainer(name).inspect();
      if (info.Config.Labels[LABELS.hostId] !== options.hostId) throw error;
      await ensureRunning(name);
    }
    workspaces.set(spec.workspaceId, { ...assignment, env: { ...spec.env } });
  }

  async function removeWorkspace(assignment: Assignment): Promise<void> {
    workspaces.delete(assignment.workspaceId);
    await removeContainer(assignment.containerId);
    await removeTree(folderPath(assignment.folder));
    await rm(recordFile(assignment.workspaceId), { force: true });
  }

  // ----- exec -----

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
  async function terminate(workspace: LiveWorkspace, marker: string, ended: Promise<void>, why: string, innerDeadline: number): Promise<void> {
    const container = docker.getContainer(workspace.containerId);
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

  async function execute(
    workspace: LiveWorkspace,
    request: ExecRequest,
    onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void,
    signal: AbortSignal,
  ): Promise<ExecResult> {
    signal.throwIfAborted();
    if (request.argv.length === 0) throw new WorkspaceError("backend_failure", "argv is empty");
    const segments = await resolveWorkspaceDirectory(folderPath(workspace.folder), request.workingDirectory);
    const env = mergeEnv(workspace.env, request.env);
    const marker = `keel-exec-${randomUUID()}`;
    // A second past the host's deadline: the host kills first and precisely; this one is the
    // fallback for a host that cannot (no pid for the kill exec, or this process died).
    const innerSeconds = Math.ceil(request.timeoutMs / 1000) + 1;
    const container = docker.getContainer(workspace.containerId);
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
      await terminate(workspace, marker, ended, outcome === "timeout" ? `its ${request.timeoutMs} ms timeout` : "an abort", started + innerSeconds * 1000);
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

  return {
    name: "docker",

    async acquire(spec, signal) {
      if (closed) throw new WorkspaceError("backend_failure", "backend is closed");
      const pending = inflight.get(spec.workspaceId);
      if (pending !== undefined) return pending;
      const promise = acquireNow(spec, signal)
        .catch((error: unknown) => {
          throw signal.aborted ? error : failure(`acquire ${spec.workspaceId} failed`, error);
        })
        .finally(() => inflight.delete(spec.workspaceId));
      inflight.set(spec.workspaceId, promise);
      return promise;
    },

    async exec(workspaceId, request, onOutput, signal) {
      return execute(await resolve(workspaceId), request, onOutput, signal);
    },

    async readFile(workspaceId, p, maxBytes) {
      return readWorkspaceFile(folderPath((await resolve(workspaceId)).folder), p, maxBytes);
    },

    async writeFile(workspaceId, p, content) {
      await writeWorkspaceFile(folderPath((await resolve(workspaceId)).folder), p, content, SANDBOX_USER);
    },

    async listFiles(workspaceId, p) {
      return listWorkspaceFiles(folderPath((await resolve(workspaceId)).folder), p);
    },

    async release(workspaceId) {
      try {
        const found = workspaces.get(workspaceId) ?? (await findPersisted(workspaceId));
        if (found !== undefined) await removeWorkspace(found);
      } catch (error) {
        throw failure(`release ${workspaceId} failed`, error);
      }
    },

    async list() {
      try {
        const records = await readRecords();
        const found: WorkspaceSummary[] = [];
        for (const container of await listManaged()) {
          const record = recordOf(container, records);
          if (record !== undefined) found.push({ workspaceId: record.workspaceId, runId: record.runId });
          else if (container.Labels[LABELS.warm] !== "true") {
            found.push({ workspaceId: container.Labels[LABELS.workspaceId] ?? "", runId: container.Labels[LABELS.runId] ?? "" });
          }
        }
        return found.filter((w) => w.workspaceId !== "");
      } catch (error) {
        throw failure("list failed", error);
      }
    },

    async reap(keep) {
      try {
        const records = await readRecords();
        const idleOwned = new Set(pools.flatMap((p) => p.idle.map((s) => s.containerId)));
        const removed: string[] = [];
        const seen = new Set<string>();
        for (const container of await listManaged()) {
          const record = recordOf(container, records);
          const label = container.Labels[LABELS.workspaceId] ?? "";
          if (record === undefined && container.Labels[LABELS.warm] === "true") {
            // An idle pool container: ours stays; an earlier process's is an orphan.
            if (idleOwned.has(container.Id) || ownPoolIds.has(label)) continue;
            await removeContainer(container.Id);
            if (WARM_ID.test(label)) await removeTree(folderPath(`.${label}`));
            continue;
          }
          const assignment: Assignment = record ?? {
            workspaceId: label,
            runId: container.Labels[LABELS.runId] ?? "",
            hostId: options.hostId,
            containerId: container.Id,
            folder: encodeId(label),
          };
          seen.add(assignment.workspaceId);
          if (assignment.workspaceId === "" || keep(assignment.workspaceId)) continue;
          await removeWorkspace(assignment);
          removed.push(assignment.workspaceId);
        }
        // Records whose container is already gone: remove the folder and the record.
        for (const record of records) {
          if (seen.has(record.workspaceId) || keep(record.workspaceId)) continue;
          await removeWorkspace(record);
          removed.push(record.workspaceId);
        }
        return removed;
      } catch (error) {
        throw failure("reap failed", error);
      }
    },

    async close() {
      closed = true;
      await Promise.allSettled(inflight.values());
      await Promise.allSettled(pools.map((p) => p.filling));
      for (const pool of pools) {
        for (const slot of pool.idle.splice(0)) {
          await removeContainer(slot.containerId).catch((error: unknown) => log(`close: remove ${slot.containerId}: ${message(error)}`));
          await removeTree(folderPath(slot.folder));
        }
      }
      // Assigned workspaces stay: a restarted agent announces them and the control plane decides.
      workspaces.clear();
    },

    poolStatus() {
      return pools.map((p) => ({ image: p.image, size: p.size, idle: p.idle.length }));
    },

    async poolsFilled() {
      for (;;) {
        const filling = pools.map((p) => p.filling).filter((f) => f !== undefined);
        if (filling.length === 0) return;
        await Promise.allSettled(filling);
      }
    },
  };
}
