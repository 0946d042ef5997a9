import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { rows, type Sql } from "./sql.js";

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
      const found = await rows<Record<string, unknown>>(
        sql,
        "SELECT * FROM emissions WHERE connector = ? AND seq > ? ORDER BY seq LIMIT ?",
        [connector, afterSeq, limit],
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
