import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_COLUMNS, type EmissionRow } from "./rows/ledger-rows.js";
import { raw, statement, type Sql } from "./sql.js";

export interface EmissionQueries {
  /**
   * Records a delivery outcome once. A settled emission is never reopened: an
   * ambiguous delivery stays ambiguous rather than inviting a re-send.
   */
  acknowledge(emissionId: string, outcome: Exclude<DeliveryStatus, "pending">, remoteRef: string, detail: string): Promise<EmissionRecord | undefined>;
  get(emissionId: string): Promise<EmissionRecord | undefined>;
}

const emissionId = (p: { readonly emissionId: string }) => p.emissionId;

const settleDelivery = statement<{ emissionId: string; outcome: DeliveryStatus; remoteRef: string; detail: string }>("emission_acknowledge")`
  UPDATE emissions SET delivery_status = ${(p) => p.outcome}, remote_ref = nullif(${(p) => p.remoteRef}::text, ''),
    delivery_detail = nullif(${(p) => p.detail}::text, ''), settled_at = now()
  WHERE id = ${emissionId}::uuid AND delivery_status = 'pending'`;

const selectEmission = statement<{ emissionId: string }, EmissionRow>("emission_get")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e WHERE e.id = ${emissionId}::uuid`;

export function createEmissionRepository(sql: Sql): EmissionQueries {
  return {
    async acknowledge(emissionId, outcome, remoteRef, detail) {
      await sql.run(settleDelivery, { emissionId, outcome, remoteRef, detail });
      return this.get(emissionId);
    },
    async get(emissionId) {
      const [row] = await sql.run(selectEmission, { emissionId });
      return row === undefined ? undefined : toEmissionRecord(row);
    },
  };
}
