// The fleet as operators see it (RunService.ListSandboxHosts): every host the ledger knows, its
// capacity and labels, whether an agent holds it and on which replica, its last heartbeat, and
// the runs holding active workspaces on it. A read only; hosts page by id.
import type { HostCapacity } from "../sandbox/workspace-lease-store.js";
import { asDate, optionalDate, raw, statement, type Sql } from "./sql.js";

/** Runs listed per host: a host's workspaces are bounded by its capacity, this bounds the reply too. */
export const MAX_RUNS_PER_HOST = 100;

export interface SandboxHostView {
  readonly hostId: string;
  readonly capacity: HostCapacity;
  readonly labels: Readonly<Record<string, string>>;
  readonly backends: readonly string[];
  readonly images: readonly string[];
  readonly connected: boolean;
  readonly replicaId: string;
  readonly lastHeartbeatAt: Date | undefined;
  readonly registeredAt: Date;
  readonly workspacesInUse: number;
  readonly runIds: readonly string[];
}

export interface SandboxHostReads {
  /** Up to `limit` hosts in id order, after `afterHostId` when given. */
  listHosts(limit: number, afterHostId: string | undefined): Promise<SandboxHostView[]>;
}

interface HostViewRow {
  id: string;
  capacity: Partial<HostCapacity>;
  labels: Record<string, string>;
  backends: string[];
  images: string[];
  connected: boolean;
  replica_id: string;
  last_heartbeat_at: Date | null;
  registered_at: Date;
  in_use: number;
  run_ids: string[] | null;
}

const listHostsStatement = statement<{ limit: number; after: string | null }, HostViewRow>("sandbox_host_views")`
  SELECT h.id, h.capacity, h.labels, h.backends, h.images, h.connected, h.replica_id, h.last_heartbeat_at, h.registered_at,
    (SELECT count(*)::int FROM workspaces w WHERE w.host_id = h.id AND w.status = 'active') AS in_use,
    (SELECT array_agg(DISTINCT r.run_id::text) FROM (
       SELECT w.run_id FROM workspaces w WHERE w.host_id = h.id AND w.status = 'active' ORDER BY w.acquired_at LIMIT ${raw(String(MAX_RUNS_PER_HOST))}) r) AS run_ids
  FROM sandbox_hosts h
  WHERE ${(p) => p.after}::text IS NULL OR h.id > ${(p) => p.after}::text
  ORDER BY h.id
  LIMIT ${(p) => p.limit}::int`;

export function createSandboxHostReads(sql: Sql): SandboxHostReads {
  return {
    async listHosts(limit, afterHostId) {
      const rows = await sql.run(listHostsStatement, { limit, after: afterHostId ?? null });
      return rows.map((row) => ({
        hostId: row.id,
        capacity: { workspaces: Number(row.capacity.workspaces ?? 0), cpuMillis: Number(row.capacity.cpuMillis ?? 0), memoryBytes: Number(row.capacity.memoryBytes ?? 0) },
        labels: row.labels,
        backends: row.backends,
        images: row.images,
        connected: row.connected,
        replicaId: row.replica_id,
        lastHeartbeatAt: optionalDate(row.last_heartbeat_at),
        registeredAt: asDate(row.registered_at),
        workspacesInUse: row.in_use,
        runIds: row.run_ids ?? [],
      }));
    },
  };
}
