// `keel gc`: deletes finished runs older than a cutoff, with everything recorded about them,
// straight on the ledger (the server need not run). The server's sweeper does the same on a timer.
import { parseArgs } from "node:util";
import { pino } from "pino";
import { openKeelLedger } from "../app.js";
import type { KeelConfig } from "../config.js";
import { adoptInstallSettingsEnv } from "../install-settings-env.js";
import { createInstallSettingsRepository } from "../ledger/install-settings.repository.js";
import { createRetentionRepository, type RetentionCounts } from "../ledger/retention.repository.js";

export const GC_USAGE = "keel gc [--older-than 30d] [--dry-run]   (units: h, d, w; default: the install's retention_days, `keel settings get`)";

const UNIT_MS: Readonly<Record<string, number>> = { h: 3_600_000, d: 86_400_000, w: 7 * 86_400_000 };

/** `30d`, `12h`, `2w`; undefined when it is none of those (a zero age would delete every finished run). */
export function parseAge(text: string): number | undefined {
  const match = /^(\d{1,6})([hdw])$/.exec(text.trim());
  if (match?.[1] === undefined || match[2] === undefined) return undefined;
  const amount = Number(match[1]);
  return amount > 0 ? amount * (UNIT_MS[match[2]] ?? 0) : undefined;
}

export async function gcCommand(args: readonly string[], config: () => KeelConfig, out: (line: string) => void, now = new Date()): Promise<number> {
  let values: { "older-than"?: string | undefined; "dry-run"?: boolean | undefined };
  try {
    ({ values } = parseArgs({ args: [...args], options: { "older-than": { type: "string" }, "dry-run": { type: "boolean", default: false } } }));
  } catch (error) {
    return usage(error instanceof Error ? error.message : String(error));
  }
  const loaded = config();
  let ageMs: number | undefined;
  if (values["older-than"] !== undefined) {
    ageMs = parseAge(values["older-than"]);
    if (ageMs === undefined) return usage(`--older-than ${values["older-than"]} is not an age such as 30d, 12h or 2w`);
  }
  const dryRun = values["dry-run"] === true;
  const ledger = await openKeelLedger(loaded, pino({ level: "silent" }));
  try {
    if (ageMs === undefined) {
      // The install's setting, as every server's sweeper reads it (a deprecated variable seeds a ledger nobody has set).
      const settings = createInstallSettingsRepository(ledger.sql);
      await adoptInstallSettingsEnv(settings, loaded.installSettingsFromEnv, pino({ level: "warn" }, pino.destination(2)));
      const days = (await settings.get()).retentionDays;
      if (days === 0) {
        out("retention is off (the install's retention_days is 0): nothing deleted; pass --older-than to collect anyway");
        return 0;
      }
      ageMs = days * UNIT_MS["d"]!;
    }
    const finishedBefore = new Date(now.getTime() - ageMs);
    const counts = await createRetentionRepository(ledger.sql).sweep({ finishedBefore, dryRun });
    out(`${dryRun ? "would delete" : "deleted"} runs finished before ${finishedBefore.toISOString()}:`);
    for (const line of describeCounts(counts)) out(`  ${line}`);
    return 0;
  } finally {
    await ledger.close();
  }
}

/** One line per table, the runs first; tables with nothing removed are left out. */
export function describeCounts(counts: RetentionCounts): string[] {
  const entries = Object.entries(counts) as [keyof RetentionCounts, number][];
  const lines = entries.filter(([table, n]) => n > 0 || table === "runs").map(([table, n]) => `${table}: ${n}`);
  return lines;
}

function usage(problem: string): number {
  process.stderr.write(`keel: ${problem}\n\n  ${GC_USAGE}\n`);
  return 2;
}
