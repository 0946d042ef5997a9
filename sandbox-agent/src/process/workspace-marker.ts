// A process workspace on disk: <root>/<encoded id>/workspace.json names it (workspaceId, runId,
// hostId and the sandbox settings), and <root>/<encoded id>/files/ is the workspace itself. The
// marker sits beside the files, not among them, so commands cannot rewrite it.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { writeJsonAtomically } from "../host-files.js";
import { DEFAULT_WORKSPACE_LIMITS } from "../workspace-backend.js";

export interface Marker {
  readonly workspaceId: string;
  readonly runId: string;
  readonly hostId: string;
  readonly networkAccess: boolean;
  readonly tmpfsBytes: number;
}

/** A workspace this process serves: its marker, its folders, and the commands running in it. */
export interface ProcessWorkspace {
  readonly marker: Marker;
  readonly folder: string;
  readonly files: string;
  /** Granted env; in memory only, never written to disk. Empty for a workspace found on disk but not (re)acquired. */
  readonly env: Readonly<Record<string, string>>;
  readonly running: Set<{ kill(): void }>;
}

const MARKER = "workspace.json";
const FILES = "files";

/** The folder commands see as /workspace. */
export const filesOf = (folder: string): string => path.join(folder, FILES);

export async function readMarker(folder: string): Promise<Marker | undefined> {
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

export function sameMarker(a: Marker, b: Marker): boolean {
  return a.runId === b.runId && a.hostId === b.hostId && a.networkAccess === b.networkAccess && a.tmpfsBytes === b.tmpfsBytes;
}

export async function writeMarker(folder: string, marker: Marker): Promise<void> {
  await writeJsonAtomically(path.join(folder, MARKER), marker);
}
