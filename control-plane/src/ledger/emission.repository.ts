import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_SEQUENCE_LOCK } from "./ledger-writes.js";
import { preparedRows, rows, type Sql } from "./sql.js";

export interface EmissionQueries {
  /** Emissions for a connector after a cursor, oldest first. */
  listAfter(connector: string, afterSeq: number, limit: number): Promise<readonly EmissionRecord[]>;
  /**
   * Records a delivery outcome once. A settled emission is never reopened: an
   * ambiguous delivery stays ambiguous rather than inviting a re-send.
   */
  acknowledge(emissionId: string, outcome: Exclude<DeliveryStatus, "pending">, remoteRef: string, detail: string): Promise<EmissionRecord | undefined>;
  get(emissionId: string): Promise<EmissionRecord | undefined>;
}

export function createEmissionRepository(sql: Sql): EmissionQueries {
  return {
    async listAfter(connector, afterSeq, limit) {
      // The settled horizon: with the emission-order lock held exclusively (for this statement
      // only), no writer is between drawing a seq and finishing its commit, so every seq up to
      // the sequence's last value is committed or gone for good (see EMISSION_SEQUENCE_LOCK).
      // New writers wait only while this read waits for the writers in flight to commit; they
      // never wait for each other.
      const [settled] = await preparedRows<{ horizon: string }>(
        sql,
        // A CTE calling a volatile function is evaluated, once, before the row that reads from it.
        `WITH barrier AS (SELECT pg_advisory_xact_lock(${EMISSION_SEQUENCE_LOCK}) AS held)
         SELECT coalesce(pg_sequence_last_value('emissions_seq_seq'::regclass), 0) AS horizon FROM barrier`,
      );
      // A later statement, so a later snapshot: every row up to the horizon is in it.
      const found = await rows<Record<string, unknown>>(
        sql,
        "SELECT * FROM emissions WHERE connector = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        [connector, afterSeq, settled?.horizon ?? "0", limit],
      );
      return found.map(toEmissionRecord);
    },
    async acknowledge(emissionId, outcome, remoteRef, detail) {
      await sql.query(
        `UPDATE emissions SET delivery_status = ?, remote_ref = nullif(?, ''), delivery_detail = nullif(?, ''), settled_at = now()
         WHERE id = ? AND delivery_status = 'pending'`,
        [outcome, remoteRef, detail, emissionId],
      );
      return this.get(emissionId);
    },
    async get(emissionId) {
      const [row] = await rows<Record<string, unknown>>(sql, "SELECT * FROM emissions WHERE id = ?", [emissionId]);
      return row === undefined ? undefined : toEmissionRecord(row);
    },
  };
}
