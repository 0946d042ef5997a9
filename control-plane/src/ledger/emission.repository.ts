import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_COLUMNS, type EmissionRow } from "./rows/ledger-rows.js";
import { raw, statement, type Sql } from "./sql.js";

/** Whose emissions a caller may settle: connector names and agent ids, or any. */
export interface AcknowledgeScope {
  readonly connectors: readonly string[] | "any";
  readonly agents: readonly string[] | "any";
}

export interface EmissionQueries {
  /**
   * Records a delivery outcome once, if the emission is within `scope`, and returns the emission
   * as it is afterwards (in one statement). A settled emission is never reopened: an ambiguous
   * delivery stays ambiguous rather than inviting a re-send.
   */
  acknowledge(
    emissionId: string,
    outcome: Exclude<DeliveryStatus, "pending">,
    remoteRef: string,
    detail: string,
    scope: AcknowledgeScope,
  ): Promise<EmissionRecord | undefined>;
  get(emissionId: string): Promise<EmissionRecord | undefined>;
}

const emissionId = (p: { readonly emissionId: string }) => p.emissionId;

interface SettleParams {
  readonly emissionId: string;
  readonly outcome: DeliveryStatus;
  readonly remoteRef: string;
  readonly detail: string;
  /** null: any. */
  readonly connectors: readonly string[] | null;
  readonly agents: readonly string[] | null;
}

// The row comes back as it is after the statement: updated when it was pending and within the
// scope, else unchanged (the caller then refuses an out-of-scope emission by what it sees).
const settleDelivery = statement<SettleParams, EmissionRow>("emission_acknowledge")`
  WITH settled AS (
    UPDATE emissions e SET delivery_status = ${(p) => p.outcome}, remote_ref = nullif(${(p) => p.remoteRef}::text, ''),
      delivery_detail = nullif(${(p) => p.detail}::text, ''), settled_at = now()
    WHERE e.id = ${emissionId}::uuid AND e.delivery_status = 'pending'
      AND (${(p) => p.connectors}::text[] IS NULL OR e.connector = ANY(${(p) => p.connectors}::text[]))
      AND (${(p) => p.agents}::text[] IS NULL OR e.agent_id IS NULL OR e.agent_id = ANY(${(p) => p.agents}::text[]))
    RETURNING ${raw(EMISSION_COLUMNS("e"))}
  )
  SELECT ${raw(EMISSION_COLUMNS("settled"))} FROM settled
  UNION ALL
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e WHERE e.id = ${emissionId}::uuid AND NOT EXISTS (SELECT FROM settled)`;

const selectEmission = statement<{ emissionId: string }, EmissionRow>("emission_get")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e WHERE e.id = ${emissionId}::uuid`;

export function createEmissionRepository(sql: Sql): EmissionQueries {
  return {
    async acknowledge(emissionId, outcome, remoteRef, detail, scope) {
      const within = (names: readonly string[] | "any") => (names === "any" ? null : names);
      const [row] = await sql.run(settleDelivery, { emissionId, outcome, remoteRef, detail, connectors: within(scope.connectors), agents: within(scope.agents) });
      return row === undefined ? undefined : toEmissionRecord(row);
    },
    async get(emissionId) {
      const [row] = await sql.run(selectEmission, { emissionId });
      return row === undefined ? undefined : toEmissionRecord(row);
    },
  };
}
