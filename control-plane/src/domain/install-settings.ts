// Settings every replica of an install must agree on. They live in one ledger row (not in each
// process's environment), so two replicas configured differently cannot apply different rules.
import { InvalidArgumentError } from "./errors.js";
import { DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS } from "./run-start.js";

export interface InstallSettings {
  /** Root runs executing at once across all agents (each agent has its own ceiling too). */
  readonly rootRunCeiling: number;
  /** Finished runs older than this many days are deleted with their records; 0 keeps them forever. */
  readonly retentionDays: number;
}

/** The settings with who last changed them and when; `updatedBy` undefined: never changed. */
export interface InstallSettingsRecord extends InstallSettings {
  readonly updatedBy: string | undefined;
  readonly updatedAt: Date;
}

export const DEFAULT_INSTALL_SETTINGS: InstallSettings = {
  rootRunCeiling: DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS,
  retentionDays: 30,
};

/** Each setting's range, its proto field name and the deprecated environment variable that once held it. */
export const INSTALL_SETTING_FIELDS = {
  rootRunCeiling: { field: "root_run_ceiling", env: "KEEL_MAX_CONCURRENT_ROOT_RUNS", min: 1, max: 100_000 },
  retentionDays: { field: "retention_days", env: "KEEL_RETENTION_DAYS", min: 0, max: 36_500 },
} as const satisfies Record<keyof InstallSettings, { field: string; env: string; min: number; max: number }>;

export type InstallSettingName = keyof InstallSettings;
export const INSTALL_SETTING_NAMES = Object.keys(INSTALL_SETTING_FIELDS) as InstallSettingName[];

/** A change: the settings to set, the others left as they are. */
export type InstallSettingsChange = Partial<InstallSettings>;

/** Throws InvalidArgument naming the proto field of the first value out of its range. */
export function validateInstallSettingsChange(change: InstallSettingsChange): InstallSettingsChange {
  for (const name of INSTALL_SETTING_NAMES) {
    const value = change[name];
    if (value === undefined) continue;
    const { field, min, max } = INSTALL_SETTING_FIELDS[name];
    if (!Number.isInteger(value) || value < min || value > max) throw new InvalidArgumentError(field, `must be a whole number from ${min} to ${max}, got ${value}`);
  }
  return change;
}

/** The settings that differ between `before` and `after`, as `old -> new`, for the audit log. */
export function describeChange(before: InstallSettings, after: InstallSettings): Record<string, string> {
  const changed: Record<string, string> = {};
  for (const name of INSTALL_SETTING_NAMES) {
    if (before[name] !== after[name]) changed[INSTALL_SETTING_FIELDS[name].field] = `${before[name]} -> ${after[name]}`;
  }
  return changed;
}
