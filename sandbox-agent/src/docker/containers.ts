// The engine operations the docker backend builds on: creating a hardened container over a
// quota'd host folder of its own (workspace-disks.ts), from a pinned image (image-pins.ts) and,
// when granted, on the isolated workspace network (workspace-network.ts); removing one with its
// folder, and starting one that stopped.
import { mkdir } from "node:fs/promises";
import type Dockerode from "dockerode";
import type { WorkspaceLimits } from "../workspace-backend.js";
import { hardenedContainerConfig, SANDBOX_USER } from "./container-config.js";
import { statusCode } from "./engine-errors.js";
import { createImagePins } from "./image-pins.js";
import { createWorkspaceDisks } from "./workspace-disks.js";
import { createWorkspaceNetwork } from "./workspace-network.js";

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
  /** Removes a workspace folder: its mount, its files and its disk image. */
  removeFolder(folder: string): Promise<void>;
  /** Starts a stopped container, its folder's file system mounted first (after a host reboot). */
  ensureRunning(containerId: string, folder: string): Promise<void>;
}

export interface ContainerSettings {
  readonly hostId: string;
  readonly root: string;
  readonly recordsDir: string;
  /** Disk quota per workspace in bytes; 0 for none. */
  readonly diskQuotaBytes: number;
  /** Where the quota'd folders are mounted (workspace-disks.ts); default DEFAULT_MOUNT_BASE. */
  readonly mountBase?: string;
  readonly log: (msg: string) => void;
}

export function createContainers(docker: Dockerode, settings: ContainerSettings): Containers {
  const { hostId, root, recordsDir } = settings;
  let rootReady: Promise<void> | undefined;
  const disks = createWorkspaceDisks(root, settings.diskQuotaBytes, settings.mountBase);
  const folderPath = (folder: string): string => disks.folderPath(folder);
  const pins = createImagePins(docker, settings.log);
  const network = createWorkspaceNetwork(docker, settings.log);

  /**
   * Under the engine's userns-remap, container uid 10001 is another host uid, and the folders
   * this agent chowns to 10001 would be unwritable inside: refuse clearly instead. Without it,
   * every workspace shares host uid 10001 (docs/security.md says what that means).
   */
  async function checkUserNamespaces(): Promise<void> {
    const info = (await docker.info()) as { SecurityOptions?: string[] };
    if ((info.SecurityOptions ?? []).some((o) => o.includes("name=userns"))) {
      throw new Error("the Docker engine remaps user namespaces (userns-remap); the docker backend does not map folder ownership for it yet");
    }
    settings.log(`docker engine without user-namespace remapping: workspaces run as host uid ${SANDBOX_USER.uid}, isolated by seccomp, no capabilities and cgroups`);
  }

  function ensureRoot(): Promise<void> {
    rootReady ??= (async () => {
      await mkdir(root, { recursive: true, mode: 0o700 });
      await mkdir(recordsDir, { recursive: true, mode: 0o700 });
      await checkUserNamespaces();
      await disks.sweep();
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
      // Both are memoized (free after the first time); the mount comes after them so that a
      // failure leaves no mount behind half-made while the caller cleans up.
      const [image, networkName] = await Promise.all([pins.resolve(args.image), args.networkAccess ? network.ensure() : undefined]);
      await disks.prepare(hostFolder, SANDBOX_USER);
      let container: Dockerode.Container;
      try {
        container = await docker.createContainer({
          ...(args.name === undefined ? {} : { name: args.name }),
          ...hardenedContainerConfig({
            ...args,
            image,
            hostId,
            hostFolder,
            ...(networkName === undefined ? {} : { network: networkName }),
            ...(disks.quotaBytes > 0 ? { maxFileBytes: disks.quotaBytes } : {}),
          }),
        });
      } catch (error) {
        // The pinned image was removed from the engine: the next attempt resolves the tag again.
        if (statusCode(error) === 404) pins.forget(args.image);
        throw error;
      }
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

    async removeFolder(folder) {
      await disks.remove(folderPath(folder));
    },

    async ensureRunning(containerId, folder) {
      const info = await docker.getContainer(containerId).inspect();
      if (info.State.Running) return;
      // Without its mount the container would write to the host's disk, unbounded.
      await disks.ensureMounted(folderPath(folder));
      await docker.getContainer(containerId).start();
    },
  };
}
