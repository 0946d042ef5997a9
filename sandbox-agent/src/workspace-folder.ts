// Folder confinement: the host-side file access both backends use on a workspace's host folder.
// Paths are workspace paths (relative, or /workspace/...); anything that leaves the workspace,
// lexically or through a symlink a command planted, is refused.
import { randomUUID } from "node:crypto";
import { constants as fsConstants, type Stats } from "node:fs";
import { lstat, mkdir, open, opendir, readlink, realpath, rename, unlink, type FileHandle } from "node:fs/promises";
import path from "node:path";
import { errorCode } from "./host-files.js";
import { WorkspaceError, type FileEntry } from "./workspace-backend.js";
import { resolveWorkspaceLinks } from "./workspace-links.js";

/** Where commands see the workspace (Docker, bubblewrap); the logical root of every path. */
export const WORKSPACE_MOUNT = "/workspace";

const MAX_LIST_ENTRIES = 10_000;

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

function outside(p: string): WorkspaceError {
  return new WorkspaceError("path_outside_workspace", `path is outside /workspace: ${JSON.stringify(p)}`);
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
  // Segments arrive with their links resolved (resolved() below): one that is a link now was swapped in.
  return open(viaFd(parent.fd, name), fsConstants.O_RDONLY | fsConstants.O_DIRECTORY | fsConstants.O_NOFOLLOW);
}

/** The real segments a workspace path leads to, links resolved by reading them (workspace-links.ts). */
async function resolved(folder: string, segments: readonly string[], shown: string, followLast = true): Promise<string[]> {
  const rootReal = await realpath(folder).catch((error: unknown) => {
    if (errorCode(error) === "ENOENT") throw new WorkspaceError("not_found", "workspace folder is gone");
    throw error;
  });
  return resolveWorkspaceLinks(rootReal, segments, { mount: WORKSPACE_MOUNT, followLast, shown });
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
    const handle = await walk(folder, await resolved(folder, segments, p), p);
    await handle.close();
  } catch (error) {
    wrapFsError(error, p);
  }
  return segments;
}

export async function readWorkspaceFile(folder: string, p: string, maxBytes: number): Promise<Uint8Array> {
  if (workspaceSegments(p).length === 0) throw new WorkspaceError("not_found", `not a file: ${p}`);
  try {
    const segments = await resolved(folder, workspaceSegments(p), p);
    const name = segments.pop();
    if (name === undefined) throw new WorkspaceError("not_found", `not a file: ${p}`);
    const dir = await walk(folder, segments, p);
    let file: FileHandle;
    try {
      // Checked before it is opened: a device or FIFO a command planted is never opened at all.
      if (!(await lstat(viaFd(dir.fd, name))).isFile()) throw new WorkspaceError("not_found", `not a regular file: ${p}`);
      // O_NONBLOCK: a FIFO swapped in meanwhile must not hang the host; O_NOFOLLOW: nor a link.
      file = await open(viaFd(dir.fd, name), fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY | fsConstants.O_NOFOLLOW);
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
    // The folder's links are resolved; the name's own link is replaced, never written through.
    const dir = await walk(folder, await resolved(folder, segments, p), p, { owner });
    try {
      let mode = 0o644;
      const existing = await lstat(viaFd(dir.fd, name)).catch((e: unknown) => {
        if (errorCode(e) === "ENOENT") return undefined;
        throw e;
      });
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
  try {
    const segments = await resolved(folder, workspaceSegments(p), p);
    const dir = await walk(folder, segments, p);
    try {
      // Streamed with a cap: a folder of millions of names is refused without loading them all.
      const names: string[] = [];
      for await (const entry of await opendir(viaFd(dir.fd))) {
        names.push(entry.name);
        if (names.length > MAX_LIST_ENTRIES) throw new WorkspaceError("too_large", `${p} has more than ${MAX_LIST_ENTRIES} entries`);
      }
      names.sort();
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
