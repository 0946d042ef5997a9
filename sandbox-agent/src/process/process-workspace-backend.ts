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
// One folder per workspace under workspaceRoot (layout in workspace-marker.ts); list() and
// reap() find workspaces by their markers.
import { mkdir, readdir } from "node:fs/promises";
import path from "node:path";
import { encodeId, removeTree } from "../host-files.js";
import { WorkspaceError, type WorkspaceBackend, type WorkspaceSpec, type WorkspaceSummary } from "../workspace-backend.js";
import { listWorkspaceFiles, readWorkspaceFile, writeWorkspaceFile } from "../workspace-folder.js";
import { probeBubblewrap, type Bubblewrap } from "./bubblewrap.js";
import { executeInProcess } from "./process-exec.js";
import { filesOf, readMarker, sameMarker, writeMarker, type Marker, type ProcessWorkspace } from "./workspace-marker.js";

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
    const workspace: ProcessWorkspace = { marker, folder, files: filesOf(folder), env: {}, running: new Set() };
    workspaces.set(workspaceId, workspace);
    return workspace;
  }

  async function acquireNow(spec: WorkspaceSpec, signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    await sandbox();
    const folder = folderOf(spec.workspaceId);
    await mkdir(root, { recursive: true, mode: 0o700 });
    await mkdir(filesOf(folder), { recursive: true, mode: 0o700 });
    const marker: Marker = {
      workspaceId: spec.workspaceId,
      runId: spec.runId,
      hostId: options.hostId,
      networkAccess: spec.networkAccess,
      tmpfsBytes: spec.limits.tmpfsBytes,
    };
    const existing = await readMarker(folder);
    if (existing === undefined || !sameMarker(existing, marker)) await writeMarker(folder, marker);
    const previous = workspaces.get(spec.workspaceId);
    workspaces.set(spec.workspaceId, {
      marker,
      folder,
      files: filesOf(folder),
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

  /** Markers of this host's workspaces under the root, with their folders. */
  async function ownMarkers(): Promise<{ marker: Marker; folder: string }[]> {
    const found: { marker: Marker; folder: string }[] = [];
    for (const name of await readdir(root).catch(() => [] as string[])) {
      const folder = path.join(root, name);
      const marker = await readMarker(folder);
      if (marker !== undefined && marker.hostId === options.hostId && encodeId(marker.workspaceId) === name) found.push({ marker, folder });
    }
    return found;
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
      return executeInProcess(await find(workspaceId), request, onOutput, signal, sandbox);
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
      for (const { marker } of await ownMarkers()) found.push({ workspaceId: marker.workspaceId, runId: marker.runId });
      return found;
    },

    async reap(keep) {
      const removed: string[] = [];
      for (const { marker, folder } of await ownMarkers()) {
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
