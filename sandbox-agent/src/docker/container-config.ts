// What every workspace container is, warm or cold: the hardened create options and the labels
// a reaper finds it by.
import type Dockerode from "dockerode";
import type { WorkspaceLimits } from "../workspace-backend.js";
import type { FolderOwner } from "../workspace-folder.js";

/** The unprivileged user every workspace container runs as; owns the workspace folders. */
export const SANDBOX_USER: FolderOwner = { uid: 10001, gid: 10001 };

export const LABELS = {
  workspaceId: "keel.workspace-id",
  hostId: "keel.host-id",
  runId: "keel.run-id",
  managed: "keel.managed",
  warm: "keel.warm",
} as const;

/**
 * The create options of a workspace container: an unprivileged user, no capabilities, no new
 * privileges, a read-only root with the workspace folder bind-mounted and a noexec /tmp, pids,
 * memory (no swap) and CPU limits, no network unless granted, and the labels a reaper finds it
 * by. Exported so the sandbox benchmark's cold baseline creates exactly this container.
 */
export function hardenedContainerConfig(args: {
  readonly image: string;
  readonly limits: WorkspaceLimits;
  readonly networkAccess: boolean;
  /** The host folder mounted at /workspace. */
  readonly hostFolder: string;
  readonly hostId: string;
  readonly workspaceLabel: string;
  readonly runId: string;
  readonly warm: boolean;
}): Dockerode.ContainerCreateOptions {
  return {
    Image: args.image,
    // The container only idles; commands arrive through docker exec.
    Entrypoint: ["sleep", "2147483647"],
    Cmd: [],
    WorkingDir: "/workspace",
    User: `${SANDBOX_USER.uid}:${SANDBOX_USER.gid}`,
    Env: [],
    Labels: {
      [LABELS.workspaceId]: args.workspaceLabel,
      [LABELS.hostId]: args.hostId,
      [LABELS.runId]: args.runId,
      [LABELS.managed]: "true",
      ...(args.warm ? { [LABELS.warm]: "true" } : {}),
    },
    HostConfig: {
      Init: true,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges"],
      ReadonlyRootfs: true,
      Mounts: [{ Type: "bind", Source: args.hostFolder, Target: "/workspace", ReadOnly: false }],
      Tmpfs: { "/tmp": `rw,noexec,nosuid,nodev,size=${args.limits.tmpfsBytes}` },
      PidsLimit: args.limits.pids,
      Memory: args.limits.memoryBytes,
      MemorySwap: args.limits.memoryBytes,
      NanoCpus: args.limits.nanoCpus,
      NetworkMode: args.networkAccess ? "bridge" : "none",
      RestartPolicy: { Name: "no" },
    },
  };
}
