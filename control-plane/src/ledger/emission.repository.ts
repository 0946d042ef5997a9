import type { DeliveryStatus, EmissionRecord } from "../domain/records.js";
import { toEmissionRecord } from "./row-mapping.js";
import { EMISSION_COLUMNS, type EmissionRow } from "./rows/ledger-rows.js";
import { raw, statement, type Sql } from "./sql.js";

/** Whose emissions a caller may settle: connector names and agent ids, or any. */
export interface AcknowledgeScope {
  readonly connectors: readonly string[] | "any";
  readonly agents: readonly string[] | "any";
}

/** One delivery outcome a connector reports. */
export interface Acknowledgement {
  readonly emissionId: string;
  readonly outcome: Exclude<DeliveryStatus, "pending">;
  readonly remoteRef: string;
  readonly detail: string;
}

export interface EmissionQueries {
  /**
   * Records delivery outcomes, in one statement, and returns the emissions found as they are
   * afterwards, in request order. All or none: unless every emission exists and is within
   * `scope`, nothing is settled (the caller refuses by what it sees). A settled emission is never
   * reopened: an ambiguous delivery stays ambiguous rather than inviting a re-send.
   */
  acknowledge(acknowledgements: readonly Acknowledgement[], scope: AcknowledgeScope): Promise<EmissionRecord[]>;
  get(emissionId: string): Promise<EmissionRecord | undefined>;
}

const emissionId = (p: { readonly emissionId: string }) => p.emissionId;

interface SettleParams {
  readonly ids: readonly string[];
  readonly outcomes: readonly string[];
  readonly remoteRefs: readonly string[];
  readonly details: readonly string[];
  /** null: any. */
  readonly connectors: readonly string[] | null;
  readonly agents: readonly string[] | null;
}

const settleDeliveries = statement<SettleParams, EmissionRow & { ord: string }>("emission_acknowledge")`
  WITH request AS (
    SELECT * FROM unnest(${(p) => p.ids}::uuid[], ${(p) => p.outcomes}::text[], ${(p) => p.remoteRefs}::text[], ${(p) => p.details}::text[])
      WITH ORDINALITY AS r(id, outcome, remote_ref, detail, ord)),
  found AS (
    SELECT (${(p) => p.connectors}::text[] IS NULL OR e.connector = ANY(${(p) => p.connectors}::text[]))
      AND (${(p) => p.agents}::text[] IS NULL OR e.agent_id IS NULL OR e.agent_id = ANY(${(p) => p.agents}::text[])) AS within
    FROM emissions e JOIN request r ON r.id = e.id),
  admissible AS (
    SELECT (SELECT count(*) FROM found) = (SELECT count(*) FROM request) AND coalesce((SELECT bool_and(within) FROM found), true) AS ok),
  settled AS (
    UPDATE emissions e SET delivery_status = r.outcome, remote_ref = nullif(r.remote_ref, ''),
      delivery_detail = nullif(r.detail, ''), settled_at = now()
    FROM request r, admissible a
    WHERE a.ok AND e.id = r.id AND e.delivery_status = 'pending'
    RETURNING ${raw(EMISSION_COLUMNS("e"))}),
  after AS (
    SELECT ${raw(EMISSION_COLUMNS("settled"))} FROM settled
    UNION ALL
    SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e JOIN request r ON r.id = e.id
    WHERE NOT EXISTS (SELECT FROM settled s WHERE s.id = e.id))
  SELECT after.*, r.ord FROM after JOIN request r ON r.id = after.id ORDER BY r.ord`;

const selectEmission = statement<{ emissionId: string }, EmissionRow>("emission_get")`
  SELECT ${raw(EMISSION_COLUMNS("e"))} FROM emissions e WHERE e.id = ${emissionId}::uuid`;

export function createEmissionRepository(sql: Sql): EmissionQueries {
  return {
    async acknowledge(acknowledgements, scope) {
      const within = (names: readonly string[] | "any") => (names === "any" ? null : names);
      const rows = await sql.run(settleDeliveries, {
        ids: acknowledgements.map((a) => a.emissionId),
        outcomes: acknowledgements.map((a) => a.outcome),
        remoteRefs: acknowledgements.map((a) => a.remoteRef),
        details: acknowledgements.map((a) => a.detail),
        connectors: within(scope.connectors),
        agents: within(scope.agents),
      });
      return rows.map(toEmissionRecord);
    },
    async get(emissionId) {
      const [row] = await sql.run(selectEmission, { emissionId });
      return row === undefined ? undefined : toEmissionRecord(row);
    },
  };
}
