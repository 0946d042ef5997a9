// `keel settings get|set`: the install-wide settings every replica applies, read and changed over
// AgentService (an admin token) so a change reaches every replica without a restart.
import { parseArgs } from "node:util";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { AgentService, type InstallSettings } from "../../../gen/keel/v1/agent_service_pb.js";
import { INSTALL_SETTING_FIELDS, INSTALL_SETTING_NAMES, type InstallSettingsChange } from "../domain/install-settings.js";
import { settingFlag } from "../install-settings-env.js";
import { clientTls, connect, resolveToken, resolveUrl } from "./client.js";

export const SETTINGS_USAGE = `keel settings get | keel settings set ${INSTALL_SETTING_NAMES.map((name) => `[${settingFlag(INSTALL_SETTING_FIELDS[name].field)} N]`).join(" ")}`;

/** Thrown for a command line that cannot be a request; main prints it with the usage. */
export class SettingsUsageError extends Error {}

export async function settingsCommand(args: readonly string[], env: Readonly<Record<string, string | undefined>>, out: (line: string) => void): Promise<number> {
  // Every option takes a value: --url, --token and one flag per setting.
  const options: Record<string, { type: "string" }> = { url: { type: "string" }, token: { type: "string" } };
  for (const name of INSTALL_SETTING_NAMES) options[settingFlag(INSTALL_SETTING_FIELDS[name].field).slice(2)] = { type: "string" };
  const { values, positionals } = parseArgs({ args: [...args], allowPositionals: true, options });
  const [action, ...extra] = positionals;
  if ((action !== "get" && action !== "set") || extra.length > 0) throw new SettingsUsageError("settings needs get or set");
  const client = connect(AgentService, { url: resolveUrl(stringOf(values["url"]), env), token: resolveToken(stringOf(values["token"]), env), ...clientTls(env) });
  if (action === "get") {
    print((await client.getInstallSettings({})).settings, out);
    return 0;
  }
  const request: { -readonly [K in keyof InstallSettingsChange]: number } = {};
  for (const name of INSTALL_SETTING_NAMES) {
    const flag = settingFlag(INSTALL_SETTING_FIELDS[name].field);
    const text = stringOf(values[flag.slice(2)]);
    if (text === undefined) continue;
    // Whole numbers only; the server checks the range and names the field when it is out of it.
    if (!/^\d{1,10}$/.test(text)) throw new SettingsUsageError(`${flag} ${text} is not a whole number`);
    request[name] = Number(text);
  }
  if (Object.keys(request).length === 0) throw new SettingsUsageError(`settings set needs at least one of ${INSTALL_SETTING_NAMES.map((name) => settingFlag(INSTALL_SETTING_FIELDS[name].field)).join(", ")}`);
  print((await client.putInstallSettings(request)).settings, out);
  return 0;
}

const stringOf = (value: unknown): string | undefined => (typeof value === "string" ? value : undefined);

/** One `field value` line per setting, then who changed them last and when. */
function print(settings: InstallSettings | undefined, out: (line: string) => void): void {
  if (settings === undefined) return;
  out(`root_run_ceiling ${settings.rootRunCeiling}`);
  out(`retention_days ${settings.retentionDays}`);
  const when = settings.updatedAt === undefined ? "" : ` at ${timestampDate(settings.updatedAt).toISOString()}`;
  out(settings.updatedBy === "" ? "defaults (never changed)" : `changed by ${settings.updatedBy}${when}`);
}
