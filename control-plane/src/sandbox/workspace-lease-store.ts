// The sandbox module's port to the ledger: hosts as they register and leave, and the
// workspace leases that tie one run to one workspace on one host.

export interface HostCapacity {
  readonly workspaces: number;
  readonly cpuMillis: number;
  readonly memoryBytes: number;
}

export interface HostRecord {
  readonly hostId: string;
  readonly instanceId: string;
  readonly capacity: HostCapacity;
  readonly labels: Readonly<Record<string, string>>;
  readonly backends: readonly string[];
  readonly images: readonly string[];
}

export type WorkspaceStatus = "active" | "released" | "lost" | "failed";

export interface WorkspaceLease {
  readonly id: string;
  readonly hostId: string;
  readonly runId: string;
  readonly image: string;
  readonly status: WorkspaceStatus;
}

export interface WorkspaceLeaseStore {
  /** Records the host as connected; returns the instance id it registered with before, if any. */
  registerHost(host: HostRecord): Promise<string | undefined>;
  hostDisconnected(hostId: string): Promise<void>;
  heartbeat(hostId: string): Promise<void>;
  /** Whether any control-plane replica has the host attached, as far as the ledger knows. */
  isHostConnected(hostId: string): Promise<boolean>;
  activeWorkspaceIdsOfHost(hostId: string): Promise<string[]>;
  /** Marks active workspaces of a host lost (all of them, or those named); returns the ids marked. */
  markLost(hostId: string, workspaceIds: readonly string[] | "all"): Promise<string[]>;
  /** The instance id of the agent holding a live Attach stream of the host on another replica, if one does. */
  instanceAttachedElsewhere(hostId: string): Promise<string | undefined>;
  /** markLost(hostId, "all") unless the host is attached to another replica now (it moved; its workspaces live on). */
  markLostIfDetached(hostId: string): Promise<string[]>;
  activeWorkspaceOfRun(runId: string): Promise<WorkspaceLease | undefined>;
  activeCountsByHost(): Promise<Map<string, number>>;
  createWorkspace(lease: Omit<WorkspaceLease, "status">): Promise<void>;
  /** Moves an active workspace to a final status; false when it was no longer active. */
  finish(workspaceId: string, status: Exclude<WorkspaceStatus, "active">): Promise<boolean>;
  /** Active workspaces whose run ended at least `keepMs` ago (stamping keep_until on the way). */
  dueForRelease(keepMs: number, limit: number): Promise<WorkspaceLease[]>;
}

/** A host some replica holds the Attach stream of. */
export interface FleetHost {
  readonly hostId: string;
  /** The replica holding its Attach stream. */
  readonly replicaId: string;
  readonly capacity: HostCapacity;
  readonly labels: Readonly<Record<string, string>>;
  readonly images: readonly string[];
  /** Its active workspaces as of the read. */
  readonly active: number;
  /** Heard from (registration or heartbeat) recently; a replica trusts its own hub over this. */
  readonly live: boolean;
}

/** The fleet as every replica sees it: live hosts, placement that cannot overbook, and routes. */
export interface SandboxFleetStore extends WorkspaceLeaseStore {
  /** This process's replica id (what host rows it holds are marked with). */
  readonly replicaId: string;
  /** Hosts connected to some replica, each saying whether it was heard from recently. */
  liveHosts(): Promise<FleetHost[]>;
  /**
   * Records the workspace on its host if the host is live and has a free slot, serialized per
   * host by a row lock so concurrent placements (from any replica) never exceed its capacity.
   */
  placeWorkspace(lease: Omit<WorkspaceLease, "status">): Promise<boolean>;
  /** The replica holding the host's live Attach stream, if any. */
  hostReplica(hostId: string): Promise<string | undefined>;
}
