// The engine operations the docker backend builds on: creating a hardened container over a
// host folder of its own, removing one, and starting one that stopped.
import { chown, mkdir } from "node:fs/promises";
import path from "node:path";
import type Dockerode from "dockerode";
import type { WorkspaceLimits } from "../workspace-backend.js";
import { hardenedContainerConfig, SANDBOX_USER } from "./container-config.js";
import { statusCode } from "./engine-errors.js";

export interface NewContainer {
  readonly image: string;
  readonly limits: WorkspaceLimits;
  readonly networkAccess: boolean;
  /** Folder name under the workspace root, mounted at /workspace. */
  readonly folder: string;
  readonly workspaceLabel: string;
  readonly runId: string;
  readonly warm: boolean;
  readonly name?: string;
}

export interface Containers {
  readonly docker: Dockerode;
  readonly hostId: string;
  /** The host path of a folder name under the workspace root. */
  readonly folderPath: (folder: string) => string;
  /** Makes the workspace root and the records folder (once; again after a failure). */
  ensureRoot(): Promise<void>;
  /** Creates and starts a container; returns its id. */
  create(args: NewContainer): Promise<string>;
  /** Removes a container, running or not; one already gone is fine. */
  remove(containerId: string): Promise<void>;
  ensureRunning(containerId: string): Promise<void>;
}

export function createContainers(docker: Dockerode, hostId: string, root: string, recordsDir: string): Containers {
  let rootReady: Promise<void> | undefined;
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

  return {
    docker,
    hostId,
    folderPath,
    ensureRoot,

    async create(args) {
      await ensureRoot();
      const hostFolder = folderPath(args.folder);
      await mkdir(hostFolder, { recursive: true, mode: 0o700 });
      await chown(hostFolder, SANDBOX_USER.uid, SANDBOX_USER.gid);
      const container = await docker.createContainer({
        ...(args.name === undefined ? {} : { name: args.name }),
        ...hardenedContainerConfig({ ...args, hostId, hostFolder }),
      });
      try {
        await container.start();
      } catch (error) {
        await container.remove({ force: true }).catch(() => undefined);
        throw error;
      }
      return container.id;
    },

    async remove(containerId) {
      try {
        await docker.getContainer(containerId).remove({ force: true });
      } catch (error) {
        if (statusCode(error) !== 404) throw error;
      }
    },

    async ensureRunning(containerId) {
      const info = await docker.getContainer(containerId).inspect();
      if (!info.State.Running) await docker.getContainer(containerId).start();
    },
  };
}
