// The host's own files under the workspace root: injective folder names for ids, atomic JSON
// records, and tree removal that survives what a command did to permissions.
import { randomUUID } from "node:crypto";
import { chmod, readdir, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { WorkspaceError } from "./workspace-backend.js";

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

/** The errno-style code of a Node error ("ENOENT"), if it has one. */
export function errorCode(error: unknown): string | undefined {
  return typeof error === "object" && error !== null && "code" in error && typeof error.code === "string" ? error.code : undefined;
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
  await writeFile(temporary, `${JSON.stringify(value)}\n`, { mode: 0o600 });
  await rename(temporary, file);
}

