// The install's settings row (install_settings, id 1). Hot statements do not call this: they read
// the value they need by subquery (run-start.sql.ts INSTALL_CEILING_SQL); this serves the admin
// RPCs, the retention sweeper and the start-up check of deprecated environment variables.
import { DEFAULT_INSTALL_SETTINGS, type InstallSettingsChange, type InstallSettingsRecord } from "../domain/install-settings.js";
import { asDate, statement, type Sql } from "./sql.js";

export interface InstallSettingsRepository {
  get(): Promise<InstallSettingsRecord>;
  /** Sets the values given, leaves the others, and records who did it; returns the row before and after. */
  update(change: InstallSettingsChange, by: string): Promise<{ readonly before: InstallSettingsRecord; readonly after: InstallSettingsRecord }>;
  /**
   * Sets the values given only while nobody has set any (updated_by null), as a ledger created
   * before the settings moved there adopts its environment's values once. Returns the row after.
   */
  seedIfUnset(change: InstallSettingsChange, by: string): Promise<{ readonly seeded: boolean; readonly settings: InstallSettingsRecord }>;
}

interface SettingsRow {
  root_run_ceiling: number;
  retention_days: number;
  updated_by: string | null;
  updated_at: Date;
}

interface ChangeParams {
  readonly rootRunCeiling: number | null;
  readonly retentionDays: number | null;
  readonly by: string;
}

const selectSettings = statement<Record<string, never>, SettingsRow>("install_settings_get")`
  SELECT root_run_ceiling, retention_days, updated_by, updated_at FROM install_settings WHERE id = 1`;

/** The old values come from the row locked first, so two changes at once each report what they replaced. */
const updateSettings = statement<ChangeParams, SettingsRow & { old_root_run_ceiling: number; old_retention_days: number; old_updated_by: string | null; old_updated_at: Date }>(
  "install_settings_update",
)`
  WITH before AS (SELECT root_run_ceiling, retention_days, updated_by, updated_at FROM install_settings WHERE id = 1 FOR NO KEY UPDATE)
  UPDATE install_settings s SET
    root_run_ceiling = coalesce(${(p) => p.rootRunCeiling}::int, s.root_run_ceiling),
    retention_days = coalesce(${(p) => p.retentionDays}::int, s.retention_days),
    updated_by = ${(p) => p.by}::text, updated_at = now()
  FROM before WHERE s.id = 1
  RETURNING s.root_run_ceiling, s.retention_days, s.updated_by, s.updated_at,
    before.root_run_ceiling AS old_root_run_ceiling, before.retention_days AS old_retention_days,
    before.updated_by AS old_updated_by, before.updated_at AS old_updated_at`;

const seedSettings = statement<ChangeParams, SettingsRow>("install_settings_seed")`
  UPDATE install_settings s SET
    root_run_ceiling = coalesce(${(p) => p.rootRunCeiling}::int, s.root_run_ceiling),
    retention_days = coalesce(${(p) => p.retentionDays}::int, s.retention_days),
    updated_by = ${(p) => p.by}::text, updated_at = now()
  WHERE s.id = 1 AND s.updated_by IS NULL
  RETURNING s.root_run_ceiling, s.retention_days, s.updated_by, s.updated_at`;

const toRecord = (row: SettingsRow): InstallSettingsRecord => ({
  rootRunCeiling: Number(row.root_run_ceiling),
  retentionDays: Number(row.retention_days),
  updatedBy: row.updated_by ?? undefined,
  updatedAt: asDate(row.updated_at),
});

const paramsOf = (change: InstallSettingsChange, by: string): ChangeParams => ({
  rootRunCeiling: change.rootRunCeiling ?? null,
  retentionDays: change.retentionDays ?? null,
  by,
});

/** The migration creates the row; were it gone, the defaults apply, as INSTALL_CEILING_SQL's do. */
const MISSING_ROW: SettingsRow = {
  root_run_ceiling: DEFAULT_INSTALL_SETTINGS.rootRunCeiling,
  retention_days: DEFAULT_INSTALL_SETTINGS.retentionDays,
  updated_by: null,
  updated_at: new Date(0),
};

export function createInstallSettingsRepository(sql: Sql): InstallSettingsRepository {
  const get = async (): Promise<InstallSettingsRecord> => toRecord((await sql.run(selectSettings, {}))[0] ?? MISSING_ROW);
  return {
    get,
    async update(change, by) {
      const [row] = await sql.run(updateSettings, paramsOf(change, by));
      if (row === undefined) throw new Error("install_settings has no row 1: the ledger's migrations did not run");
      const before = toRecord({ root_run_ceiling: row.old_root_run_ceiling, retention_days: row.old_retention_days, updated_by: row.old_updated_by, updated_at: row.old_updated_at });
      return { before, after: toRecord(row) };
    },
    async seedIfUnset(change, by) {
      const [row] = await sql.run(seedSettings, paramsOf(change, by));
      return row === undefined ? { seeded: false, settings: await get() } : { seeded: true, settings: toRecord(row) };
    },
  };
}
