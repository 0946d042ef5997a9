// Assignment records: <workspaceRoot>/.keel-records/<encoded workspace id>.json names the
// container and folder that serve a workspace. They are written host-side, atomically and
// outside every mount (commands cannot forge them), and they are what makes a warm container a
// workspace: Docker labels are fixed at creation, so a pool container keeps its pool labels.
import { readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import type Dockerode from "dockerode";
import { encodeId, writeJsonAtomically } from "../host-files.js";

export interface Assignment {
  readonly workspaceId: string;
  readonly runId: string;
  readonly hostId: string;
  /** The container's id (warm) or name (cold: the record is written before the container exists); Docker takes either. */
  readonly containerId: string;
  /** Folder name under workspaceRoot. */
  readonly folder: string;
}

/** An assignment this process serves, with the env it was granted. */
export interface LiveWorkspace extends Assignment {
  /** Granted env; in memory only. */
  readonly env: Readonly<Record<string, string>>;
}

export const RECORDS = ".keel-records";

/** The keel.workspace-id label of a pool container, and (dot-prefixed) the name of its folder. */
export const WARM_ID = /^warm-[0-9a-f-]{36}$/;

/** A folder name this backend made: an encoded workspace id or ".warm-<uuid>". */
function isOwnFolderName(folder: string): boolean {
  return /^[A-Za-z0-9_-]+$/.test(folder) || (folder.startsWith(".") && WARM_ID.test(folder.slice(1)));
}

export interface AssignmentRecords {
  /** This host's record of the workspace, if there is one. */
  read(workspaceId: string): Promise<Assignment | undefined>;
  /** Every valid record of this host. */
  readAll(): Promise<Assignment[]>;
  write(assignment: Assignment): Promise<void>;
  remove(workspaceId: string): Promise<void>;
}

export function createAssignmentRecords(recordsDir: string, hostId: string): AssignmentRecords {
  const recordFile = (workspaceId: string): string => path.join(recordsDir, `${encodeId(workspaceId)}.json`);

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
      if (parsed.hostId !== hostId) return undefined;
      return { workspaceId: parsed.workspaceId, runId: parsed.runId, hostId: parsed.hostId, containerId: parsed.containerId, folder: parsed.folder };
    } catch {
      return undefined;
    }
  }

  return {
    async read(workspaceId) {
      const record = await readRecord(recordFile(workspaceId));
      return record?.workspaceId === workspaceId ? record : undefined;
    },

    async readAll() {
      const records: Assignment[] = [];
      for (const name of await readdir(recordsDir).catch(() => [] as string[])) {
        if (!name.endsWith(".json")) continue;
        const record = await readRecord(path.join(recordsDir, name));
        if (record !== undefined && `${encodeId(record.workspaceId)}.json` === name) records.push(record);
      }
      return records;
    },

    async write(assignment) {
      await writeJsonAtomically(recordFile(assignment.workspaceId), assignment);
    },

    async remove(workspaceId) {
      await rm(recordFile(workspaceId), { force: true });
    },
  };
}

/** The record for a listed container: records name warm containers by id, cold ones by name. */
export function recordOf(container: Dockerode.ContainerInfo, records: readonly Assignment[]): Assignment | undefined {
  const refs = new Set([container.Id, ...container.Names.map((n) => n.replace(/^\//, ""))]);
  return records.find((r) => refs.has(r.containerId));
}
