// The deprecated environment variables of install-wide settings (KEEL_MAX_CONCURRENT_ROOT_RUNS,
// KEEL_RETENTION_DAYS). The ledger's values apply on every replica; a variable only seeds a ledger
// nobody has set yet, so an install upgraded with its variables keeps its values. Otherwise a
// variable that disagrees with the ledger draws one warning at start-up saying so and how to change it.
import type { Logger } from "pino";
import { INSTALL_SETTING_FIELDS, INSTALL_SETTING_NAMES, type InstallSettingsChange } from "./domain/install-settings.js";
import type { InstallSettingsRepository } from "./ledger/install-settings.repository.js";

/** The CLI flag that sets a setting, from its proto field name (root_run_ceiling → --root-run-ceiling). */
export const settingFlag = (field: string): string => `--${field.replaceAll("_", "-")}`;

export async function adoptInstallSettingsEnv(settings: InstallSettingsRepository, fromEnv: InstallSettingsChange, log: Logger): Promise<void> {
  const given = INSTALL_SETTING_NAMES.filter((name) => fromEnv[name] !== undefined);
  if (given.length === 0) return;
  const variables = given.map((name) => INSTALL_SETTING_FIELDS[name].env);
  const { seeded, settings: current } = await settings.seedIfUnset(fromEnv, `environment (${variables.join(", ")})`);
  if (seeded) {
    log.warn(
      { variables, settings: { rootRunCeiling: current.rootRunCeiling, retentionDays: current.retentionDays } },
      `${variables.join(" and ")} ${given.length === 1 ? "is" : "are"} deprecated: copied once into the ledger's install settings, which every replica applies; ` +
        "from now on change them with `keel settings set` and unset the variables",
    );
    return;
  }
  for (const name of given) {
    const { env, field } = INSTALL_SETTING_FIELDS[name];
    if (fromEnv[name] === current[name]) continue;
    log.warn(
      { variable: env, environment: fromEnv[name], ledger: current[name] },
      `${env}=${fromEnv[name]} is deprecated and ignored: the ledger's ${field} (${current[name]}) applies on every replica; ` +
        `change it with \`keel settings set ${settingFlag(field)} N\` and unset ${env}`,
    );
  }
}
