import { EXECUTING_SQL } from "./run-start.sql.js";
import { raw, statement, type Sql } from "./sql.js";

const runsByStatus = statement<Record<string, never>, { status: string; n: string }>("metrics_runs_by_status")`
  SELECT status, count(*) AS n FROM runs GROUP BY status ORDER BY status`;

const ledgerGauges = statement<
  Record<string, never>,
  { oldest_queued_s: number | null; expired_leases: string; unknown_outcomes: string; pending_emissions: string }
>("metrics_ledger_gauges")`
  SELECT
    (SELECT extract(epoch FROM now() - min(created_at)) FROM runs WHERE status = 'queued' AND NOT paused) AS oldest_queued_s,
    (SELECT count(*) FROM runs WHERE status IN (${raw(EXECUTING_SQL)}) AND lease_expires_at < now()) AS expired_leases,
    (SELECT count(*) FROM tool_invocations WHERE status = 'unknown_outcome' AND resolved_outcome IS NULL) AS unknown_outcomes,
    (SELECT count(*) FROM emissions WHERE delivery_status = 'pending') AS pending_emissions`;

/**
 * Prometheus text for what an operator gets paged on, read from the ledger at scrape
 * time so every replica reports the same truth: runs by status, the age of the oldest
 * queued run, runs waiting on an unknown outcome, leases that have expired unclaimed.
 */
export async function ledgerMetrics(sql: Sql): Promise<string> {
  const [byStatus, [ages]] = await Promise.all([sql.run(runsByStatus, {}), sql.run(ledgerGauges, {})]);
  const lines = [
    "# HELP keel_runs Runs in the ledger by status.",
    "# TYPE keel_runs gauge",
    ...byStatus.map((row) => `keel_runs{status="${row.status}"} ${Number(row.n)}`),
    "# HELP keel_oldest_queued_run_age_seconds Age of the oldest runnable queued run; growth means workers are not keeping up.",
    "# TYPE keel_oldest_queued_run_age_seconds gauge",
    `keel_oldest_queued_run_age_seconds ${Number(ages?.oldest_queued_s ?? 0).toFixed(3)}`,
    "# HELP keel_expired_leases Runs whose worker stopped renewing its lease and that no worker has reclaimed yet.",
    "# TYPE keel_expired_leases gauge",
    `keel_expired_leases ${Number(ages?.expired_leases ?? 0)}`,
    "# HELP keel_unresolved_unknown_outcomes Tool calls whose external effect is unknown and awaits an operator.",
    "# TYPE keel_unresolved_unknown_outcomes gauge",
    `keel_unresolved_unknown_outcomes ${Number(ages?.unknown_outcomes ?? 0)}`,
    "# HELP keel_undelivered_emissions Emissions no connector has acknowledged yet.",
    "# TYPE keel_undelivered_emissions gauge",
    `keel_undelivered_emissions ${Number(ages?.pending_emissions ?? 0)}`,
  ];
  return `${lines.join("\n")}\n`;
}
