// The docker backend: one hardened container per workspace (container-config.ts), commands
// through docker exec (docker-exec.ts), an optional warm pool of idle containers (warm-pool.ts).
//
// Secrets never enter the container's configuration: the workspace env is held in this
// process's memory and passed to each exec, so `docker inspect` does not show it and warm
// containers serve any spec. After an agent restart, acquire the workspace again (idempotent)
// to re-arm its env.
//
// Every workspace, warm or cold, has an assignment record (assignment-records.ts), written
// when a warm container is taken, or before a cold one (named keel__<host>__<workspace>) is
// created. list() and reap() read records first and labels second, so assignments survive
// agent restarts; close() removes idle pool containers, and reap() removes idle pool
// containers an earlier agent process left.
//
// release() removes the container and the folder at once. Keeping a finished run's workspace
// for inspection is the control plane's decision: it calls release when the retention ends.
import path from "node:path";
import Dockerode from "dockerode";
import { encodeId } from "../host-files.js";
import { WorkspaceError, type WorkspaceBackend, type WorkspaceSpec, type WorkspaceSummary } from "../workspace-backend.js";
import { listWorkspaceFiles, readWorkspaceFile, writeWorkspaceFile } from "../workspace-folder.js";
import { createAssignmentRecords, recordOf, RECORDS, WARM_ID, type Assignment, type LiveWorkspace } from "./assignment-records.js";
import { LABELS, SANDBOX_USER } from "./container-config.js";
import { createContainers } from "./containers.js";
import { executeInContainer } from "./docker-exec.js";
import { failure, statusCode } from "./engine-errors.js";
import { createWarmPools, type WarmPoolOptions, type WarmPoolStatus } from "./warm-pool.js";

export interface DockerWorkspaceBackendOptions {
  readonly docker?: Dockerode;
  readonly hostId: string;
  /** Host folder for the bind mounts, e.g. <data>/workspaces. Must be on the Docker engine's host. */
  readonly workspaceRoot: string;
  readonly warmPool?: readonly WarmPoolOptions[];
  /**
   * Disk quota per workspace (a loop-mounted ext4 image over its folder; workspace-disks.ts).
   * Default DEFAULT_DISK_QUOTA_BYTES; 0 turns quotas off (a command can then fill the host's disk).
   */
  readonly diskQuotaBytes?: number;
  readonly log?: (msg: string) => void;
}

export const DEFAULT_DISK_QUOTA_BYTES = 8 * 1024 ** 3;

/** The port plus what operators, tests and benchmarks can observe of the warm pool. */
export interface DockerWorkspaceBackend extends WorkspaceBackend {
  readonly name: "docker";
  poolStatus(): readonly WarmPoolStatus[];
  /** Resolves when no pool is refilling (full, closed, or a refill failed and was logged). */
  poolsFilled(): Promise<void>;
}

export function createDockerWorkspaceBackend(options: DockerWorkspaceBackendOptions): DockerWorkspaceBackend {
  const docker = options.docker ?? new Dockerode();
  const log = options.log ?? (() => undefined);
  const root = path.resolve(options.workspaceRoot);
  const recordsDir = path.join(root, RECORDS);
  const hostFilter = [`${LABELS.hostId}=${options.hostId}`, `${LABELS.managed}=true`];
  const workspaces = new Map<string, LiveWorkspace>();
  const inflight = new Map<string, Promise<void>>();
  let closed = false;
  const diskQuotaBytes = options.diskQuotaBytes ?? DEFAULT_DISK_QUOTA_BYTES;
  if (!Number.isSafeInteger(diskQuotaBytes) || (diskQuotaBytes !== 0 && diskQuotaBytes < 16 * 1024 ** 2)) {
    throw new WorkspaceError("backend_failure", `diskQuotaBytes must be 0 (off) or at least 16 MiB, not ${diskQuotaBytes}`);
  }
  if (diskQuotaBytes === 0) log("workspace disk quotas are off: a command can fill the disk holding the workspace root");
  const containers = createContainers(docker, { hostId: options.hostId, root, recordsDir, diskQuotaBytes, log });
  const records = createAssignmentRecords(recordsDir, options.hostId);
  const pools = createWarmPools(options.warmPool ?? [], containers, () => closed, log);
  const execHost = { docker, log, folderPath: containers.folderPath };
  const folderPath = containers.folderPath;

  // ----- lookup -----

  async function listManaged(): Promise<Dockerode.ContainerInfo[]> {
    return docker.listContainers({ all: true, filters: { label: hostFilter } });
  }

  const coldName = (workspaceId: string): string => `keel__${encodeId(options.hostId)}__${encodeId(workspaceId)}`;

  /** Finds a workspace made by this or an earlier agent process: record first, label second. */
  async function findPersisted(workspaceId: string): Promise<Assignment | undefined> {
    const record = await records.read(workspaceId);
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
    await containers.ensureRoot();
    // Only the local record is consulted here (no engine round trip before a warm take): every
    // container this backend assigns has its record written first (cold) or at once (warm).
    const persisted = await records.read(spec.workspaceId);
    let folder = encodeId(spec.workspaceId);
    if (persisted !== undefined) {
      try {
        await containers.ensureRunning(persisted.containerId, persisted.folder);
        workspaces.set(spec.workspaceId, { ...persisted, env: { ...spec.env } });
        return;
      } catch (error) {
        if (statusCode(error) !== 404) throw error;
        // The container went away behind our back: make a new one over the same folder.
        log(`workspace ${spec.workspaceId}: container ${persisted.containerId} is gone; creating another over its folder`);
        folder = persisted.folder;
      }
    } else {
      const pool = pools.poolFor(spec);
      const slot = pool?.idle.shift();
      if (pool !== undefined && slot !== undefined) {
        const assignment: Assignment = { workspaceId: spec.workspaceId, runId: spec.runId, hostId: options.hostId, containerId: slot.containerId, folder: slot.folder };
        try {
          await records.write(assignment);
        } catch (error) {
          pool.idle.unshift(slot);
          throw error;
        }
        workspaces.set(spec.workspaceId, { ...assignment, env: { ...spec.env } });
        // Refill after the take, so the refill's work does not slow the acquisition down.
        pools.refill(pool);
        return;
      }
      if (pool !== undefined) pools.refill(pool);
    }
    signal.throwIfAborted();
    // Cold: the record (naming the container by its name) is written before the container is
    // created, so a crash in between leaves a record that the next acquire or reap resolves.
    // The name also makes creation idempotent across agent processes: a second create conflicts.
    const name = coldName(spec.workspaceId);
    const assignment: Assignment = { workspaceId: spec.workspaceId, runId: spec.runId, hostId: options.hostId, containerId: name, folder };
    await records.write(assignment);
    try {
      await containers.create({
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
        await records.remove(spec.workspaceId);
        // A folder made for this attempt goes too; one kept from a gone container holds files.
        if (persisted === undefined) await containers.removeFolder(folder).catch((e: unknown) => log(`remove folder ${folder}: ${String(e)}`));
        throw error;
      }
      const info = await docker.getContainer(name).inspect();
      if (info.Config.Labels[LABELS.hostId] !== options.hostId) throw error;
      await containers.ensureRunning(name, folder);
    }
    workspaces.set(spec.workspaceId, { ...assignment, env: { ...spec.env } });
  }

  async function removeWorkspace(assignment: Assignment): Promise<void> {
    workspaces.delete(assignment.workspaceId);
    await containers.remove(assignment.containerId);
    await containers.removeFolder(assignment.folder);
    await records.remove(assignment.workspaceId);
  }

  /** Removes every workspace `keep` rejects, and idle pool containers an earlier process left. */
  async function reapNow(keep: (workspaceId: string) => boolean): Promise<string[]> {
    const known = await records.readAll();
    const removed: string[] = [];
    const seen = new Set<string>();
    for (const container of await listManaged()) {
      const record = recordOf(container, known);
      const label = container.Labels[LABELS.workspaceId] ?? "";
      if (record === undefined && container.Labels[LABELS.warm] === "true") {
        // An idle pool container: ours stays; an earlier process's is an orphan.
        if (pools.ownsIdle(container.Id, label)) continue;
        await containers.remove(container.Id);
        if (WARM_ID.test(label)) await containers.removeFolder(`.${label}`);
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
    for (const record of known) {
      if (seen.has(record.workspaceId) || keep(record.workspaceId)) continue;
      await removeWorkspace(record);
      removed.push(record.workspaceId);
    }
    return removed;
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
      return executeInContainer(execHost, await resolve(workspaceId), request, onOutput, signal);
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
        const known = await records.readAll();
        const found: WorkspaceSummary[] = [];
        for (const container of await listManaged()) {
          const record = recordOf(container, known);
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
        return await reapNow(keep);
      } catch (error) {
        throw failure("reap failed", error);
      }
    },

    async close() {
      closed = true;
      await Promise.allSettled(inflight.values());
      await pools.drain();
      // Assigned workspaces stay: a restarted agent announces them and the control plane decides.
      workspaces.clear();
    },

    poolStatus() {
      return pools.status();
    },

    poolsFilled() {
      return pools.filled();
    },
  };
}
