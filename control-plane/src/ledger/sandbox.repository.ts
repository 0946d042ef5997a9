import type { FleetHost, HostCapacity, HostRecord, SandboxFleetStore, WorkspaceLease, WorkspaceStatus } from "../sandbox/workspace-lease-store.js";
import { LIVE_SQL } from "./run-start.sql.js";
import { raw, statement, type Sql } from "./sql.js";

interface WorkspaceRow {
  id: string;
  host_id: string;
  run_id: string;
  image: string;
  status: WorkspaceStatus;
}

const WORKSPACE_COLUMNS = "w.id, w.host_id, w.run_id, w.image, w.status";

const lease = (row: WorkspaceRow): WorkspaceLease => ({ id: row.id, hostId: row.host_id, runId: row.run_id, image: row.image, status: row.status });

const hostId = (p: { readonly hostId: string }) => p.hostId;
const runId = (p: { readonly runId: string }) => p.runId;
const workspaceId = (p: { readonly workspaceId: string }) => p.workspaceId;

const replica = (p: { readonly replicaId: string }) => p.replicaId;
/** A host counts as live while heard from within this window (ms). */
const liveWithin = (p: { readonly liveMs: number }) => p.liveMs;

/** Upserts the host as connected to this replica and returns the instance id it had registered with before, in one statement. */
const registerHostStatement = statement<HostRecord & { replicaId: string }, { previous: string | null }>("sandbox_register_host")`
  WITH before AS (SELECT instance_id FROM sandbox_hosts WHERE id = ${hostId})
  INSERT INTO sandbox_hosts (id, capacity, labels, backends, images, instance_id, connected, replica_id, last_heartbeat_at, registered_at)
  VALUES (${hostId}, ${(p) => JSON.stringify(p.capacity)}::jsonb, ${(p) => JSON.stringify(p.labels)}::jsonb,
    ${(p) => JSON.stringify(p.backends)}::jsonb, ${(p) => JSON.stringify(p.images)}::jsonb, ${(p) => p.instanceId}, true, ${replica}, now(), now())
  ON CONFLICT (id) DO UPDATE SET capacity = excluded.capacity, labels = excluded.labels, backends = excluded.backends,
    images = excluded.images, instance_id = excluded.instance_id, connected = true, replica_id = excluded.replica_id,
    last_heartbeat_at = now(), registered_at = now()
  RETURNING (SELECT instance_id FROM before) AS previous`;

/** Only this replica's hold ends: a host that has already attached to another replica stays connected there. */
const hostDisconnectedStatement = statement<{ hostId: string; replicaId: string }>("sandbox_host_disconnected")`
  UPDATE sandbox_hosts SET connected = false, replica_id = '' WHERE id = ${hostId} AND replica_id = ${replica}`;

const heartbeatStatement = statement<{ hostId: string; replicaId: string }>("sandbox_heartbeat")`
  UPDATE sandbox_hosts SET last_heartbeat_at = now(), connected = true, replica_id = ${replica} WHERE id = ${hostId}`;

const liveHostsStatement = statement<
  { liveMs: number },
  { id: string; replica_id: string; capacity: HostCapacity; labels: Record<string, string>; images: string[]; active: number; live: boolean }
>("sandbox_live_hosts")`
  SELECT h.id, h.replica_id, h.capacity, h.labels, h.images,
    (SELECT count(*)::int FROM workspaces w WHERE w.host_id = h.id AND w.status = 'active') AS active,
    coalesce(h.last_heartbeat_at > now() - (${liveWithin}::float8 * interval '1 millisecond'), false) AS live
  FROM sandbox_hosts h
  WHERE h.connected AND h.replica_id <> ''`;

const hostReplicaStatement = statement<{ hostId: string; liveMs: number }, { replica_id: string }>("sandbox_host_replica")`
  SELECT h.replica_id FROM sandbox_hosts h
  WHERE h.id = ${hostId} AND h.connected AND h.replica_id <> ''
    AND h.last_heartbeat_at > now() - (${liveWithin}::float8 * interval '1 millisecond')`;

/** Placement's first statement: the host's row lock, held to the commit, orders every placement on it. */
const lockHostStatement = statement<{ hostId: string }, { slots: number }>("sandbox_lock_host")`
  SELECT coalesce((h.capacity ->> 'workspaces')::int, 0) AS slots FROM sandbox_hosts h
  WHERE h.id = ${hostId} AND h.connected AND h.replica_id <> '' FOR NO KEY UPDATE`;

/**
 * Placement's second statement: under the lock, and (READ COMMITTED) with a snapshot taken after
 * it was granted, so it counts every placement committed before. One statement cannot do both: its
 * snapshot would predate the lock wait and miss the placement it waited for.
 */
const placeIfRoomStatement = statement<Omit<WorkspaceLease, "status"> & { slots: number }, { id: string }>("sandbox_place_if_room")`
  INSERT INTO workspaces (id, host_id, run_id, image, status)
  SELECT ${(p) => p.id}::uuid, ${hostId}, ${runId}::uuid, ${(p) => p.image}, 'active'
  WHERE (SELECT count(*) FROM workspaces w WHERE w.host_id = ${hostId} AND w.status = 'active') < ${(p) => p.slots}
  RETURNING id`;

const attachedElsewhereStatement = statement<{ hostId: string; replicaId: string; liveMs: number }, { instance_id: string }>("sandbox_attached_elsewhere")`
  SELECT h.instance_id FROM sandbox_hosts h
  WHERE h.id = ${hostId} AND h.connected AND h.replica_id NOT IN ('', ${replica})
    AND h.last_heartbeat_at > now() - (${liveWithin}::float8 * interval '1 millisecond')`;

const markLostIfDetachedStatement = statement<{ hostId: string; replicaId: string }, { id: string }>("sandbox_mark_lost_if_detached")`
  UPDATE workspaces SET status = 'lost', released_at = now()
  WHERE host_id = ${hostId} AND status = 'active'
    AND NOT EXISTS (SELECT 1 FROM sandbox_hosts h WHERE h.id = ${hostId} AND h.connected AND h.replica_id NOT IN ('', ${replica}))
  RETURNING id`;

const hostConnected = statement<{ hostId: string }, { connected: boolean }>("sandbox_host_connected")`
  SELECT connected FROM sandbox_hosts WHERE id = ${hostId}`;

const activeWorkspaceIds = statement<{ hostId: string }, { id: string }>("sandbox_active_workspace_ids")`
  SELECT id FROM workspaces WHERE host_id = ${hostId} AND status = 'active'`;

const markAllLost = statement<{ hostId: string }, { id: string }>("sandbox_mark_all_lost")`
  UPDATE workspaces SET status = 'lost', released_at = now() WHERE host_id = ${hostId} AND status = 'active' RETURNING id`;

const markSomeLost = statement<{ hostId: string; workspaceIds: readonly string[] }, { id: string }>("sandbox_mark_lost")`
  UPDATE workspaces SET status = 'lost', released_at = now()
  WHERE host_id = ${hostId} AND status = 'active' AND id = ANY(${(p) => p.workspaceIds}::uuid[]) RETURNING id`;

const activeWorkspaceOfRunStatement = statement<{ runId: string }, WorkspaceRow>("sandbox_active_workspace_of_run")`
  SELECT ${raw(WORKSPACE_COLUMNS)} FROM workspaces w
  WHERE w.run_id = ${runId}::uuid AND w.status = 'active' ORDER BY w.acquired_at DESC LIMIT 1`;

const activeCounts = statement<Record<string, never>, { host_id: string; n: number }>("sandbox_active_counts")`
  SELECT host_id, count(*)::int AS n FROM workspaces WHERE status = 'active' GROUP BY host_id`;

const createWorkspaceStatement = statement<Omit<WorkspaceLease, "status">>("sandbox_create_workspace")`
  INSERT INTO workspaces (id, host_id, run_id, image, status)
  VALUES (${(p) => p.id}::uuid, ${hostId}, ${runId}::uuid, ${(p) => p.image}, 'active')`;

const finishWorkspace = statement<{ workspaceId: string; status: WorkspaceStatus }, { id: string }>("sandbox_finish_workspace")`
  UPDATE workspaces SET status = ${(p) => p.status}, released_at = now()
  WHERE id = ${workspaceId}::uuid AND status = 'active' RETURNING id`;

/** keep_until records, for operators, how long a finished (no longer live) run's workspace stays for inspection. */
const stampKeepUntil = statement<{ keepMs: number }>("sandbox_stamp_keep_until")`
  UPDATE workspaces w SET keep_until = coalesce(r.finished_at, r.updated_at) + (${(p) => p.keepMs}::float8 * interval '1 millisecond')
  FROM runs r WHERE r.id = w.run_id AND w.status = 'active' AND w.keep_until IS NULL AND r.status NOT IN (${raw(LIVE_SQL)})
    -- A graph node's workspace stays while its graph runs: a join reads it after the child ended.
    AND NOT EXISTS (SELECT 1 FROM work_graphs g WHERE g.root_run_id = r.root_run_id AND g.status = 'running')`;

const dueWorkspaces = statement<{ limit: number }, WorkspaceRow>("sandbox_due_for_release")`
  SELECT ${raw(WORKSPACE_COLUMNS)} FROM workspaces w
  WHERE w.status = 'active' AND w.keep_until <= now() ORDER BY w.keep_until LIMIT ${(p) => p.limit}`;

export interface SandboxRepositoryOptions {
  /** This process's replica id: the host rows it holds Attach streams of carry it. */
  readonly replicaId: string;
  /** A host not heard from (registration or heartbeat) within this long is not placed on or routed to. */
  readonly liveMs: number;
}

export function createSandboxRepository(sql: Sql, options: SandboxRepositoryOptions): SandboxFleetStore {
  const { replicaId, liveMs } = options;
  return {
    replicaId,

    async registerHost(host: HostRecord) {
      const [row] = await sql.run(registerHostStatement, { ...host, replicaId });
      return row?.previous ?? undefined;
    },

    async hostDisconnected(hostId) {
      await sql.run(hostDisconnectedStatement, { hostId, replicaId });
    },

    async heartbeat(hostId) {
      await sql.run(heartbeatStatement, { hostId, replicaId });
    },

    async liveHosts(): Promise<FleetHost[]> {
      return (await sql.run(liveHostsStatement, { liveMs })).map((r) => ({
        hostId: r.id,
        replicaId: r.replica_id,
        capacity: r.capacity,
        labels: r.labels,
        images: r.images,
        active: r.active,
        live: r.live,
      }));
    },

    async hostReplica(hostId) {
      const [row] = await sql.run(hostReplicaStatement, { hostId, liveMs });
      return row?.replica_id;
    },

    placeWorkspace(lease) {
      return sql.transaction(async (trx) => {
        const [host] = await trx.run(lockHostStatement, { hostId: lease.hostId });
        if (host === undefined) return false;
        // The host's row lock goes with the COMMIT sent alongside: concurrent placements wait one round trip less.
        return (await trx.runLast(placeIfRoomStatement, { ...lease, slots: host.slots })).length > 0;
      });
    },

    async instanceAttachedElsewhere(hostId) {
      const [row] = await sql.run(attachedElsewhereStatement, { hostId, replicaId, liveMs });
      return row?.instance_id;
    },

    async markLostIfDetached(hostId) {
      return (await sql.run(markLostIfDetachedStatement, { hostId, replicaId })).map((r) => r.id);
    },

    async isHostConnected(hostId) {
      const [row] = await sql.run(hostConnected, { hostId });
      return row?.connected ?? false;
    },

    async activeWorkspaceIdsOfHost(hostId) {
      return (await sql.run(activeWorkspaceIds, { hostId })).map((r) => r.id);
    },

    async markLost(hostId, workspaceIds) {
      if (workspaceIds !== "all" && workspaceIds.length === 0) return [];
      const marked = workspaceIds === "all" ? await sql.run(markAllLost, { hostId }) : await sql.run(markSomeLost, { hostId, workspaceIds });
      return marked.map((r) => r.id);
    },

    async activeWorkspaceOfRun(runId) {
      const [row] = await sql.run(activeWorkspaceOfRunStatement, { runId });
      return row === undefined ? undefined : lease(row);
    },

    async activeCountsByHost() {
      const counts = await sql.run(activeCounts, {});
      return new Map(counts.map((c) => [c.host_id, c.n]));
    },

    async createWorkspace(workspace) {
      await sql.run(createWorkspaceStatement, workspace);
    },

    async finish(workspaceId, status) {
      return (await sql.run(finishWorkspace, { workspaceId, status })).length > 0;
    },

    async dueForRelease(keepMs, limit) {
      await sql.run(stampKeepUntil, { keepMs });
      return (await sql.run(dueWorkspaces, { limit })).map(lease);
    },
  };
}
