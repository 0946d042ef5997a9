// A disk quota per workspace folder. The engine's own quota (--storage-opt size) needs overlay2
// on XFS with project quotas; hosts without it (ext4 here) get what every Linux host has: a
// sparse ext4 image file per workspace (in the workspace root), loop-mounted on the host. The
// container bind-mounts the mount as before, so host-side file reads keep working, and a write
// past the image's size fails with ENOSPC inside the image, never on the host's disk.
//
// The mount points live outside the workspace root (under mountBase), so deleting a data dir
// whose workspaces were never released (`rm -rf`, as tests and operators do) is not refused
// with EBUSY; the mounts it orphans (their image deleted) are swept at the next agent start.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { chmod, chown, mkdir, readdir, readFile, rm, rmdir, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { errorCode, removeTree } from "../host-files.js";
import type { FolderOwner } from "../workspace-folder.js";

const run = promisify(execFile);

export interface WorkspaceDisks {
  /** Bytes each workspace may hold; 0 when quotas are off. */
  readonly quotaBytes: number;
  /** The host path of a workspace folder: its mount point, or the plain folder when quotas are off. */
  folderPath(folder: string): string;
  /** Unmounts workspace mounts whose image file was deleted behind the agent's back. */
  sweep(): Promise<void>;
  /** Makes the folder (owned by `owner`, mode 0700) and mounts its quota'd file system over it. */
  prepare(folder: string, owner: FolderOwner): Promise<void>;
  /** Mounts an existing folder's image again if it is not mounted (after a host reboot). */
  ensureMounted(folder: string): Promise<void>;
  /** Unmounts the folder, removes it and its image. A folder already gone is fine. */
  remove(folder: string): Promise<void>;
}

/** Where mount points go by default: a tmpfs, empty after a reboot like the mounts themselves. */
export const DEFAULT_MOUNT_BASE = "/run/keel-workspaces";

/**
 * `quotaBytes` 0 turns quotas off: folders are plain folders under `root` (the state before
 * quotas). Needs root (mount) and mkfs.ext4 on the engine's host.
 */
export function createWorkspaceDisks(root: string, quotaBytes: number, mountBase = DEFAULT_MOUNT_BASE): WorkspaceDisks {
  const imagesDir = path.join(root, ".keel-disks");
  // One folder per workspace root, so two agents (or tests) on a host never share mount points.
  const mountDir = path.join(mountBase, createHash("sha256").update(root).digest("hex").slice(0, 16));
  const imageOf = (folder: string): string => path.join(imagesDir, `${path.basename(folder)}.ext4`);
  let dirReady: Promise<void> | undefined;

  async function isMountPoint(folder: string): Promise<boolean> {
    try {
      const [self, parent] = await Promise.all([stat(folder), stat(path.dirname(folder))]);
      return self.dev !== parent.dev;
    } catch (error) {
      if (errorCode(error) === "ENOENT") return false;
      throw error;
    }
  }

  async function mount(folder: string): Promise<void> {
    // nosuid/nodev: nothing a command writes there may gain privileges on the host either.
    try {
      await run("mount", ["-o", "loop,nosuid,nodev,noatime", imageOf(folder), folder]);
    } catch (error) {
      // Fail closed, but say what would help: the folder must not be used without its quota.
      const detail = error instanceof Error ? error.message : String(error);
      throw new Error(`workspace disk quota: mounting ${imageOf(folder)} failed (needs root and loop devices; diskQuotaBytes 0 turns quotas off): ${detail}`, {
        cause: error,
      });
    }
  }

  return {
    quotaBytes,

    folderPath(folder) {
      return path.join(quotaBytes === 0 ? root : mountDir, folder);
    },

    async sweep() {
      let mounts: string;
      try {
        mounts = await readFile("/proc/self/mountinfo", "utf8");
      } catch {
        return;
      }
      for (const line of mounts.split("\n")) {
        // "<id> <parent> <dev> <root> <mount point> <options> ... - <fstype> <source> <options>"
        const mountPoint = line.split(" ")[4]?.replace(/\\040/g, " ");
        const source = line.split(" - ")[1]?.split(" ")[1];
        if (mountPoint === undefined || source === undefined || !mountPoint.startsWith(`${mountBase}/`)) continue;
        const loop = /^\/dev\/(loop\d+)$/.exec(source)?.[1];
        if (loop === undefined) continue;
        const backing = await readFile(`/sys/block/${loop}/loop/backing_file`, "utf8").catch(() => "");
        if (!backing.trim().endsWith(" (deleted)")) continue;
        await run("umount", ["-l", mountPoint]).catch(() => undefined);
        await rmdir(mountPoint).catch(() => undefined);
      }
      // Folders of workspace roots with nothing mounted any more (rmdir refuses non-empty ones).
      for (const name of await readdir(mountBase).catch(() => [] as string[])) {
        if (path.join(mountBase, name) !== mountDir) await rmdir(path.join(mountBase, name)).catch(() => undefined);
      }
    },

    async prepare(folder, owner) {
      await mkdir(folder, { recursive: true, mode: 0o700 });
      // Without a quota the plain folder is the workspace: the sandbox user must own it.
      if (quotaBytes === 0) return chown(folder, owner.uid, owner.gid);
      if (await isMountPoint(folder)) return;
      dirReady ??= mkdir(imagesDir, { recursive: true, mode: 0o700 }).then(() => undefined);
      await dirReady;
      const image = imageOf(folder);
      await rm(image, { force: true });
      // Sparse: the image costs what the workspace holds. Lazy init keeps mkfs near 50 ms; no
      // reserved blocks, and the root owned by the sandbox user.
      await run("truncate", ["-s", String(quotaBytes), image]);
      await run("mkfs.ext4", ["-q", "-F", "-m", "0", "-E", `lazy_itable_init=1,lazy_journal_init=1,root_owner=${owner.uid}:${owner.gid}`, image]);
      await mount(folder);
      await chmod(folder, 0o700);
      // mkfs's lost+found would show up in every listing of /workspace.
      await rmdir(path.join(folder, "lost+found")).catch(() => undefined);
    },

    async ensureMounted(folder) {
      if (quotaBytes === 0 || (await isMountPoint(folder))) return;
      try {
        await stat(imageOf(folder));
      } catch (error) {
        if (errorCode(error) === "ENOENT") return; // a folder made while quotas were off
        throw error;
      }
      // After a reboot the mount point (on a tmpfs) is gone too.
      await mkdir(folder, { recursive: true, mode: 0o700 });
      await mount(folder);
    },

    async remove(folder) {
      if (await isMountPoint(folder)) {
        try {
          await run("umount", [folder]);
        } catch {
          // Still busy (a process of a removed container lingering): detach it lazily.
          await run("umount", ["-l", folder]);
        }
      }
      await removeTree(folder);
      await rm(imageOf(folder), { force: true });
    },
  };
}
