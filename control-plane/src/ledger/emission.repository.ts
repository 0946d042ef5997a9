import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_SEQUENCE_LOCK } from "./ledger-writes.js";
import { EMISSION_COLUMNS, type EmissionRow } from "./rows/ledger-rows.js";
import { raw, statement, type Sql } from "./sql.js";

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

const emissionId = (p: { readonly emissionId: string }) => p.emissionId;

/**
 * The settled horizon: with the emission-order lock held exclusively (for this statement only),
 * no writer is between drawing a seq and finishing its commit, so every seq up to the sequence's
 * last value is committed or gone for good (see EMISSION_SEQUENCE_LOCK). New writers wait only
 * while this read waits for the writers in flight to commit; they never wait for each other.
 * A CTE calling a volatile function is evaluated, once, before the row that reads from it.
 */
const settledHorizon = statement<Record<string, never>, { horizon: string }>("emission_settled_horizon")`
  WITH barrier AS (SELECT pg_advisory_xact_lock(${raw(String(EMISSION_SEQUENCE_LOCK))}) AS held)
  SELECT coalesce(pg_sequence_last_value('emissions_seq_seq'::regclass), 0) AS horizon FROM barrier`;

const emissionsUpTo = statement<{ connector: string; afterSeq: number; horizon: string; limit: number }, EmissionRow>("emission_list_after")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e
  WHERE e.connector = ${(p) => p.connector} AND e.seq > ${(p) => p.afterSeq} AND e.seq <= ${(p) => p.horizon}::bigint
  ORDER BY e.seq LIMIT ${(p) => p.limit}`;

const settleDelivery = statement<{ emissionId: string; outcome: DeliveryStatus; remoteRef: string; detail: string }>("emission_acknowledge")`
  UPDATE emissions SET delivery_status = ${(p) => p.outcome}, remote_ref = nullif(${(p) => p.remoteRef}::text, ''),
    delivery_detail = nullif(${(p) => p.detail}::text, ''), settled_at = now()
  WHERE id = ${emissionId}::uuid AND delivery_status = 'pending'`;

const selectEmission = statement<{ emissionId: string }, EmissionRow>("emission_get")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e WHERE e.id = ${emissionId}::uuid`;

export function createEmissionRepository(sql: Sql): EmissionQueries {
  return {
    async listAfter(connector, afterSeq, limit) {
      const [settled] = await sql.run(settledHorizon, {});
      // A later statement, so a later snapshot: every row up to the horizon is in it.
      const found = await sql.run(emissionsUpTo, { connector, afterSeq, horizon: settled?.horizon ?? "0", limit });
      return found.map(toEmissionRecord);
    },
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
