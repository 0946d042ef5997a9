// Symbolic links in a workspace are resolved by reading them, never by following them: a link a
// command planted that points out of the workspace is refused without the host ever opening,
// or even looking up, its target (which would tell the command whether a host file exists, or
// open a device). Links that stay inside resolve to the real path, which is then opened with
// O_NOFOLLOW through checked directory descriptors (workspace-folder.ts).
import { lstat, readlink } from "node:fs/promises";
import path from "node:path";
import { errorCode } from "./host-files.js";
import { WorkspaceError } from "./workspace-backend.js";

/** Links followed for one path before it is refused, as the kernel's own limit does. */
const MAX_LINK_HOPS = 40;

export interface LinkResolution {
  /** Where commands see the workspace: absolute link targets below it stay inside. */
  readonly mount: string;
  /** Whether a link in the last segment is resolved too (not for a write, which replaces the link). */
  readonly followLast: boolean;
  /** The path as the caller gave it, for messages. */
  readonly shown: string;
}

/**
 * The segments below the workspace root that `segments` lead to once every symbolic link on the
 * way is replaced by its target; a missing segment ends resolution (the open reports it).
 */
export async function resolveWorkspaceLinks(rootReal: string, segments: readonly string[], options: LinkResolution): Promise<string[]> {
  const outside = () => new WorkspaceError("path_outside_workspace", `path is outside ${options.mount}: ${JSON.stringify(options.shown)}`);
  const done: string[] = [];
  let pending = [...segments];
  let hops = 0;
  while (pending.length > 0) {
    const name = pending.shift()!;
    if (name === "" || name === ".") continue;
    if (name === "..") {
      if (done.length === 0) throw outside();
      done.pop();
      continue;
    }
    // Every segment in `done` is a real folder inside the root, so this lstat follows nothing.
    const here = path.join(rootReal, ...done, name);
    const stats = await lstat(here).catch((error: unknown) => {
      const code = errorCode(error);
      if (code === "ENOENT" || code === "ENOTDIR") return undefined;
      throw error;
    });
    if (stats === undefined) return [...done, name, ...pending];
    if (!stats.isSymbolicLink() || (pending.length === 0 && !options.followLast)) {
      done.push(name);
      continue;
    }
    if (++hops > MAX_LINK_HOPS) throw new WorkspaceError("not_found", `too many levels of symbolic links: ${options.shown}`);
    const target = await readlink(here);
    if (target.startsWith("/")) {
      if (target !== options.mount && !target.startsWith(`${options.mount}/`)) throw outside();
      done.length = 0;
      pending = [...target.slice(options.mount.length).split("/"), ...pending];
    } else {
      pending = [...target.split("/"), ...pending];
    }
  }
  return done;
}
