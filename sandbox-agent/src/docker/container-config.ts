// What every workspace container is, warm or cold: the hardened create options and the labels
// a reaper finds it by.
import { readFileSync } from "node:fs";
import type Dockerode from "dockerode";
import type { WorkspaceLimits } from "../workspace-backend.js";
import type { FolderOwner } from "../workspace-folder.js";
import { WORKSPACE_NETWORK } from "./workspace-network.js";

/** The unprivileged user every workspace container runs as; owns the workspace folders. */
export const SANDBOX_USER: FolderOwner = { uid: 10001, gid: 10001 };

/**
 * The seccomp profile every workspace runs under (scripts/gen-seccomp-profile.mjs writes it):
 * sent as its JSON text, which is what the engine API takes, read once per process.
 */
export const SECCOMP_PROFILE = readFileSync(new URL("../../seccomp/keel-workspace.json", import.meta.url), "utf8");

/** Open files per process. Docker's default (the daemon's, often 1048576) lets one command pin kernel memory. */
export const NOFILE_LIMIT = 4096;
/**
 * Processes of the sandbox uid, counted by the kernel across every workspace on the host while
 * workspaces share one uid (no user-namespace remapping); the per-workspace bound is the pids limit.
 */
export const NPROC_LIMIT = 16384;
/** Relative I/O weight (10..1000; 500 is the engine's default): workspaces yield disk time to the host. */
export const BLKIO_WEIGHT = 100;

export const LABELS = {
  workspaceId: "keel.workspace-id",
  hostId: "keel.host-id",
  runId: "keel.run-id",
  managed: "keel.managed",
  warm: "keel.warm",
} as const;

/**
 * The create options of a workspace container: an unprivileged user, no capabilities, no new
 * privileges, an explicit seccomp profile, a read-only root with the workspace folder
 * bind-mounted and a noexec /tmp, pids, memory (no swap), CPU and I/O limits, ulimits, no
 * network unless granted (then the dedicated workspace network), and the labels a reaper finds
 * it by. Exported so the sandbox benchmark's cold baseline creates exactly this container.
 */
export function hardenedContainerConfig(args: {
  /** Ideally an image id (see image-pins.ts), so the container runs exactly that content. */
  readonly image: string;
  readonly limits: WorkspaceLimits;
  readonly networkAccess: boolean;
  /** The network of granted workspaces; default the dedicated one (workspace-network.ts). */
  readonly network?: string;
  /** The largest file a command may write, usually the workspace's disk quota; default 1 GiB. */
  readonly maxFileBytes?: number;
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
      SecurityOpt: ["no-new-privileges", `seccomp=${SECCOMP_PROFILE}`],
      ReadonlyRootfs: true,
      Mounts: [{ Type: "bind", Source: args.hostFolder, Target: "/workspace", ReadOnly: false }],
      Tmpfs: { "/tmp": `rw,noexec,nosuid,nodev,size=${args.limits.tmpfsBytes}` },
      PidsLimit: args.limits.pids,
      Memory: args.limits.memoryBytes,
      MemorySwap: args.limits.memoryBytes,
      NanoCpus: args.limits.nanoCpus,
      BlkioWeight: BLKIO_WEIGHT,
      Ulimits: [
        { Name: "nofile", Soft: NOFILE_LIMIT, Hard: NOFILE_LIMIT },
        { Name: "nproc", Soft: NPROC_LIMIT, Hard: NPROC_LIMIT },
        { Name: "fsize", Soft: args.maxFileBytes ?? 1024 ** 3, Hard: args.maxFileBytes ?? 1024 ** 3 },
      ],
      NetworkMode: args.networkAccess ? (args.network ?? WORKSPACE_NETWORK) : "none",
      RestartPolicy: { Name: "no" },
    },
  };
}
