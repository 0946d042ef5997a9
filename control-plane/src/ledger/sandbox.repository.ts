import type { HostRecord, WorkspaceLease, WorkspaceLeaseStore, WorkspaceStatus } from "../sandbox/workspace-lease-store.js";
import { rows, type Sql } from "./sql.js";

interface WorkspaceRow {
  id: string;
  host_id: string;
  run_id: string;
  image: string;
  status: WorkspaceStatus;
}

const TERMINAL_RUN_STATUSES = ["succeeded", "failed", "cancelled", "budget_exhausted"];

const lease = (row: WorkspaceRow): WorkspaceLease => ({ id: row.id, hostId: row.host_id, runId: row.run_id, image: row.image, status: row.status });

export function createSandboxRepository(sql: Sql): WorkspaceLeaseStore {
  return {
    async registerHost(host: HostRecord) {
      const [row] = await rows<{ previous: string | null }>(
        sql,
        `WITH before AS (SELECT instance_id FROM sandbox_hosts WHERE id = ?)
         INSERT INTO sandbox_hosts (id, capacity, labels, backends, images, instance_id, connected, last_heartbeat_at, registered_at)
         VALUES (?, ?::jsonb, ?::jsonb, ?::jsonb, ?::jsonb, ?, true, now(), now())
         ON CONFLICT (id) DO UPDATE SET capacity = excluded.capacity, labels = excluded.labels, backends = excluded.backends,
           images = excluded.images, instance_id = excluded.instance_id, connected = true, last_heartbeat_at = now(), registered_at = now()
         RETURNING (SELECT instance_id FROM before) AS previous`,
        [
          host.hostId,
          host.hostId,
          JSON.stringify(host.capacity),
          JSON.stringify(host.labels),
          JSON.stringify(host.backends),
          JSON.stringify(host.images),
          host.instanceId,
        ],
      );
      return row?.previous ?? undefined;
    },

    async hostDisconnected(hostId) {
      await sql.query("UPDATE sandbox_hosts SET connected = false WHERE id = ?", [hostId]);
    },

    async heartbeat(hostId) {
      await sql.query("UPDATE sandbox_hosts SET last_heartbeat_at = now(), connected = true WHERE id = ?", [hostId]);
    },

    async isHostConnected(hostId) {
      const [row] = await rows<{ connected: boolean }>(sql, "SELECT connected FROM sandbox_hosts WHERE id = ?", [hostId]);
      return row?.connected ?? false;
    },

    async activeWorkspaceIdsOfHost(hostId) {
      const found = await rows<{ id: string }>(sql, "SELECT id FROM workspaces WHERE host_id = ? AND status = 'active'", [hostId]);
      return found.map((r) => r.id);
    },

    async markLost(hostId, workspaceIds) {
      if (workspaceIds !== "all" && workspaceIds.length === 0) return [];
      const marked = await rows<{ id: string }>(
        sql,
        workspaceIds === "all"
          ? "UPDATE workspaces SET status = 'lost', released_at = now() WHERE host_id = ? AND status = 'active' RETURNING id"
          : "UPDATE workspaces SET status = 'lost', released_at = now() WHERE host_id = ? AND status = 'active' AND id = ANY(?::uuid[]) RETURNING id",
        workspaceIds === "all" ? [hostId] : [hostId, [...workspaceIds]],
      );
      return marked.map((r) => r.id);
    },

    async activeWorkspaceOfRun(runId) {
      const [row] = await rows<WorkspaceRow>(
        sql,
        "SELECT id, host_id, run_id, image, status FROM workspaces WHERE run_id = ? AND status = 'active' ORDER BY acquired_at DESC LIMIT 1",
        [runId],
      );
      return row === undefined ? undefined : lease(row);
    },

    async activeCountsByHost() {
      const counts = await rows<{ host_id: string; n: number }>(
        sql,
        "SELECT host_id, count(*)::int AS n FROM workspaces WHERE status = 'active' GROUP BY host_id",
      );
      return new Map(counts.map((c) => [c.host_id, c.n]));
    },

    async createWorkspace(workspace) {
      await sql.query("INSERT INTO workspaces (id, host_id, run_id, image, status) VALUES (?, ?, ?, ?, 'active')", [
        workspace.id,
        workspace.hostId,
        workspace.runId,
        workspace.image,
      ]);
    },

    async finish(workspaceId, status) {
      const done = await rows<{ id: string }>(
        sql,
        "UPDATE workspaces SET status = ?, released_at = now() WHERE id = ? AND status = 'active' RETURNING id",
        [status, workspaceId],
      );
      return done.length > 0;
    },

    async dueForRelease(keepMs, limit) {
      // keep_until records, for operators, how long a finished run's workspace stays for inspection.
      await sql.query(
        `UPDATE workspaces w SET keep_until = coalesce(r.finished_at, r.updated_at) + (? * interval '1 millisecond')
         FROM runs r WHERE r.id = w.run_id AND w.status = 'active' AND w.keep_until IS NULL AND r.status = ANY(?::text[])`,
        [keepMs, TERMINAL_RUN_STATUSES],
      );
      const due = await rows<WorkspaceRow>(
        sql,
        "SELECT id, host_id, run_id, image, status FROM workspaces WHERE status = 'active' AND keep_until <= now() ORDER BY keep_until LIMIT ?",
        [limit],
      );
      return due.map(lease);
    },
  };
}
