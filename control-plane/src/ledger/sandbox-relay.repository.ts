import type { RelayKind, RelayRecord, SandboxRelayStore, TakenRelay } from "../sandbox/sandbox-relay-store.js";
import { statement, type Sql } from "./sql.js";

/** One statement stores a batch (in array order, so ids follow it) and notifies each recipient once, at commit. */
const appendStatement = statement<
  { toReplicas: readonly string[]; commandIds: readonly string[]; kinds: readonly string[]; bodies: readonly string[] },
  { notified: string }
>("sandbox_relay_append")`
  WITH added AS (
    INSERT INTO sandbox_relays (to_replica, command_id, kind, body)
    SELECT t.to_replica, t.command_id, t.kind, t.body
    FROM unnest(${(p) => p.toReplicas}::text[], ${(p) => p.commandIds}::text[], ${(p) => p.kinds}::text[], ${(p) => p.bodies}::jsonb[])
      WITH ORDINALITY AS t(to_replica, command_id, kind, body, n)
    ORDER BY t.n
    RETURNING to_replica)
  SELECT pg_notify('keel_sandbox', d.to_replica) AS notified FROM (SELECT DISTINCT to_replica FROM added) d`;

/** SKIP LOCKED: two takers in one replica never get the same record. */
const takeStatement = statement<{ replicaId: string; limit: number }, { id: string; command_id: string; kind: RelayKind; body: Record<string, unknown> }>(
  "sandbox_relay_take",
)`
  DELETE FROM sandbox_relays WHERE id IN (
    SELECT r.id FROM sandbox_relays r WHERE r.to_replica = ${(p) => p.replicaId} ORDER BY r.id LIMIT ${(p) => p.limit} FOR NO KEY UPDATE SKIP LOCKED)
  RETURNING id::text AS id, command_id, kind, body`;

const withdrawStatement = statement<{ toReplica: string; commandId: string }, { id: string }>("sandbox_relay_withdraw")`
  DELETE FROM sandbox_relays WHERE to_replica = ${(p) => p.toReplica} AND command_id = ${(p) => p.commandId} AND kind = 'command'
  RETURNING id::text AS id`;

const pruneStatement = statement<{ maxAgeMs: number }, { id: string }>("sandbox_relay_prune")`
  DELETE FROM sandbox_relays WHERE created_at < now() - (${(p) => p.maxAgeMs}::float8 * interval '1 millisecond') RETURNING id::text AS id`;

export function createSandboxRelayRepository(sql: Sql): SandboxRelayStore {
  return {
    async append(records: readonly RelayRecord[]) {
      if (records.length === 0) return;
      await sql.run(appendStatement, {
        toReplicas: records.map((r) => r.toReplica),
        commandIds: records.map((r) => r.commandId),
        kinds: records.map((r) => r.kind),
        bodies: records.map((r) => JSON.stringify(r.body)),
      });
    },

    async take(replicaId, limit): Promise<TakenRelay[]> {
      const rows = await sql.run(takeStatement, { replicaId, limit });
      // DELETE … RETURNING keeps no order: ids are the order the records were written in.
      rows.sort((a, b) => (BigInt(a.id) < BigInt(b.id) ? -1 : 1));
      return rows.map((r) => ({ commandId: r.command_id, kind: r.kind, body: r.body }));
    },

    async withdraw(toReplica, commandId) {
      return (await sql.run(withdrawStatement, { toReplica, commandId })).length > 0;
    },

    async prune(maxAgeMs) {
      return (await sql.run(pruneStatement, { maxAgeMs })).length;
    },
  };
}
