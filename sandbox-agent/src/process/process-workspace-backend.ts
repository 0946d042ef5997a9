// The process backend: a folder per workspace and child processes, for machines without
// Docker. WEAKER ISOLATION than the docker backend, and documented as such. It fails closed:
//   - by default ("bubblewrap") every command runs under bubblewrap, and without a working
//     `bwrap` nothing runs: acquire and exec fail. Each command gets new user, pid, ipc, uts,
//     cgroup and network namespaces, no capabilities, a read-only view of the system folders,
//     a private /tmp, a fresh /proc and the workspace bound read-write at /workspace: other
//     workspaces, the agent's environment and the host's files (a control plane's .keel/
//     folder, PostgreSQL's data and socket) are not visible. Still no memory or pids limits.
//   - a network grant is refused: without user-mode networking (slirp4netns/pasta) a command's
//     own network namespace has no way out, and sharing the host's would open its loopback
//     (the control plane, the database) to the command. Networked tools need the docker backend.
//   - "none" (`keel sandbox-agent --allow-unsandboxed`) runs plain child processes as the
//     agent's own user with the host's filesystem, network and process table; only the
//     environment is clean. For trusted workloads and development only; the agent warns.
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
  /** "bubblewrap" (the default): refuse to run without it. "none": plain child processes (unsafe). */
  readonly sandbox?: "bubblewrap" | "none";
}

export const BUBBLEWRAP_MISSING =
  "the process backend needs bubblewrap: `bwrap` on PATH and able to create user namespaces. Install it, use --backend docker, " +
  "or pass --allow-unsandboxed to run commands as plain child processes with the agent's own access (unsafe)";

export const NETWORK_REFUSED =
  "the process backend cannot grant network access: a sandboxed command would share the host's loopback " +
  "(no user-mode networking such as slirp4netns here); use the docker backend for networked tools";

export function createProcessWorkspaceBackend(options: ProcessWorkspaceBackendOptions): WorkspaceBackend {
  const log = options.log ?? (() => undefined);
  const mode = options.sandbox ?? "bubblewrap";
  const root = path.resolve(options.workspaceRoot);
  const workspaces = new Map<string, ProcessWorkspace>();
  const inflight = new Map<string, Promise<void>>();
  let closed = false;

  const folderOf = (workspaceId: string): string => path.join(root, encodeId(workspaceId));

  async function sandbox(): Promise<Bubblewrap | undefined> {
    if (mode === "none") return undefined;
    const found = await probeBubblewrap();
    if (found === undefined) throw new WorkspaceError("backend_failure", BUBBLEWRAP_MISSING);
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
    if ((await sandbox()) !== undefined && spec.networkAccess) throw new WorkspaceError("backend_failure", NETWORK_REFUSED);
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
