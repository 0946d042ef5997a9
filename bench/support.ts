// Shared by the benchmarks: percentiles, the printed table, ports and settings.
import { readdirSync, readFileSync } from "node:fs";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { pino } from "pino";
import { buildApp, type BuildOptions, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig, type KeelConfig } from "../control-plane/src/config.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { allowHeapGrowthForStreaming } from "../control-plane/src/heap-growth.js";
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from "../control-plane/src/ledger/embedded-postgres.js";

export interface Stats {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
}

/** The middle value (the mean of the two middle ones for an even count); NaN for none. */
export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** How a targets line judges one target: the word a reader (or a grep) looks for. */
export function verdict(met: boolean): "met" | "MISSED" {
  return met ? "met" : "MISSED";
}

/** Nearest-rank percentiles. */
export function summarize(samples: readonly number[]): Stats {
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = (p: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN;
  return { n: sorted.length, p50: rank(50), p99: rank(99) };
}

export const ms = (value: number): string => value.toFixed(2);

/** First column left-aligned, the rest right-aligned, with a rule under the header. */
export function table(header: readonly string[], body: readonly (readonly string[])[]): string[] {
  const all = [header, ...body];
  const widths = header.map((_, c) => Math.max(...all.map((row) => (row[c] ?? "").length)));
  const format = (row: readonly string[]) =>
    row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0))).join("  ");
  return [format(header), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(format)];
}

/** A command-line option a bench cannot use: bench/run.ts prints its message, not a stack. */
export class BenchUsageError extends Error {}

/** A whole-number flag's value, or an error naming the flag: `--messages must be an integer from 1 up`. */
export function integerOption(name: string, value: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new BenchUsageError(`--${name} must be an integer from ${min}${max === Number.MAX_SAFE_INTEGER ? " up" : ` to ${max}`}, not ${JSON.stringify(value)}`);
  }
  return n;
}

export function pick(env: NodeJS.ProcessEnv, keys: readonly string[]): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const key of keys) {
    const value = env[key];
    if (value !== undefined && value !== "") picked[key] = value;
  }
  return picked;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/**
 * CPU time (ms) used so far by a PostgreSQL server: the postmaster, its live backends and the
 * backends that already exited (counted in the postmaster's children totals). Linux only; 0 elsewhere.
 */
export function postgresCpuMs(dataDir: string): number {
  try {
    const postmaster = Number(readFileSync(path.join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
    const ticks = (pid: number, children: boolean): number => {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      // Fields 14-17 of stat (utime, stime, cutime, cstime) are 11-14 here, after pid and comm.
      const [utime, stime, cutime, cstime] = [11, 12, 13, 14].map((i) => Number(fields[i]));
      return utime! + stime! + (children ? cutime! + cstime! : 0);
    };
    let total = ticks(postmaster, true);
    for (const entry of readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const status = readFileSync(`/proc/${entry}/stat`, "utf8");
        const ppid = Number(status.slice(status.lastIndexOf(")") + 2).split(" ")[1]);
        if (ppid === postmaster) total += ticks(Number(entry), false);
      } catch {
        // the process exited while we looked
      }
    }
    return (total * 1000) / CLOCK_TICKS_PER_SECOND;
  } catch {
    return 0;
  }
}

/** USER_HZ: 100 on every Linux this runs on. */
const CLOCK_TICKS_PER_SECOND = 100;

/** CPU time (ms, user + system) a process has used, from /proc; 0 where there is none (not Linux, or it exited). */
export function processCpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS_PER_SECOND;
  } catch {
    return 0;
  }
}

/** CPU time (ms) this Node process has used so far. */
export function nodeCpuMs(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
}

export interface BenchPostgres {
  readonly url: string;
  /** The cluster's data folder (for postgresCpuMs). */
  readonly dataDir: string;
}

/**
 * A throwaway embedded PostgreSQL 17 for one benchmark, with default durability, in a fresh
 * temporary folder: started, handed to `work`, then stopped and removed whatever happens.
 * `work` stops what it built on it (a Keel app) before it returns or throws.
 */
export async function withBenchPostgres<T>(name: string, progress: (line: string) => void, work: (postgres: BenchPostgres) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(path.join(tmpdir(), `keel-bench-${name}-`));
  let postgres: EmbeddedPostgresHandle | undefined;
  try {
    // As root, PostgreSQL runs as the postgres user, which must be able to reach its folder.
    if (process.getuid?.() === 0) await chmod(dir, 0o755);
    const dataDir = path.join(dir, "data");
    progress(`starting embedded PostgreSQL in ${dir} (server defaults: fsync and synchronous_commit on)`);
    const statements = process.env["KEEL_BENCH_STATEMENTS"] !== undefined;
    postgres = await startEmbeddedPostgres({ dataDir, port: await freePort(), postgresFlags: statements ? STATEMENT_STATS_FLAGS : [] });
    if (statements) await queryOnce(postgres.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    const result = await work({ url: postgres.url, dataDir });
    if (statements) progress(await statementReport(postgres.url, Number(process.env["KEEL_BENCH_STATEMENTS"]) || 25));
    return result;
  } finally {
    await postgres?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

// KEEL_BENCH_STATEMENTS=N (diagnosis): PostgreSQL's N most expensive statements over the whole
// bench, planning included, printed to stderr at the end.
const STATEMENT_STATS_FLAGS = ["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=all", "-c", "pg_stat_statements.track_planning=on"];

async function queryOnce(url: string, text: string): Promise<pg.QueryResult> {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    return await db.query(text);
  } finally {
    await db.end();
  }
}

async function statementReport(url: string, top: number): Promise<string> {
  const { rows } = await queryOnce(
    url,
    `SELECT calls, plans, round((total_exec_time + total_plan_time)::numeric, 1) AS total_ms,
            round(((total_exec_time + total_plan_time) / greatest(calls, 1))::numeric, 3) AS mean_ms,
            round((total_plan_time / greatest(calls, 1))::numeric, 3) AS plan_ms, regexp_replace(query, '\\s+', ' ', 'g') AS query
       FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT ${top}`,
  );
  const lines = rows.map(
    (r: Record<string, unknown>) =>
      `${String(r["total_ms"]).padStart(10)} ${String(r["calls"]).padStart(7)} ${String(r["plans"]).padStart(7)} ${String(r["mean_ms"]).padStart(8)} ${String(r["plan_ms"]).padStart(8)}  ${String(r["query"]).slice(0, 160)}`,
  );
  const scans = await queryOnce(
    url,
    `SELECT relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
      WHERE seq_scan > 0 OR idx_scan > 0 ORDER BY seq_tup_read DESC, n_tup_ins DESC LIMIT 16`,
  );
  const column = (r: Record<string, unknown>, name: string, label: string, width: number) => `${label} ${String(r[name]).padStart(width)}`;
  const tables = scans.rows.map(
    (r: Record<string, unknown>) =>
      `  ${String(r["relname"]).padEnd(24)} ${[
        column(r, "seq_scan", "seq", 7),
        column(r, "seq_tup_read", "read", 9),
        column(r, "idx_scan", "idx", 7),
        column(r, "idx_tup_fetch", "fetched", 9),
        column(r, "n_tup_ins", "ins", 7),
        column(r, "n_tup_upd", "upd", 7),
        column(r, "n_tup_hot_upd", "hot", 7),
      ].join("  ")}`,
  );
  return ["statements by PostgreSQL time (plans: how many times PostgreSQL planned it):", "  total_ms   calls   plans  mean_ms  plan_ms  query", ...lines, "tables by rows read in sequential scans:", ...tables].join("\n");
}

/** The server's durability settings as the benchmarks print them, e.g. "fsync=on synchronous_commit=on". */
export async function durabilitySettings(db: { query<R>(text: string): Promise<{ rows: R[] }> }): Promise<string> {
  const shown = await db.query<{ fsync: string; synchronous_commit: string }>(
    "SELECT current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS synchronous_commit",
  );
  return `fsync=${shown.rows[0]?.fsync ?? "?"} synchronous_commit=${shown.rows[0]?.synchronous_commit ?? "?"}`;
}

/** Keel's durability mode (README, "Durability"); every bench runs in one and prints it. */
export type Durability = KeelConfig["durability"];

/**
 * The mode a bench runs Keel in: --durability, else KEEL_DURABILITY, else strict (Keel's default).
 * An unknown value fails before anything starts.
 */
export function benchDurability(flag: string | undefined): Durability {
  const value = flag ?? process.env["KEEL_DURABILITY"] ?? "strict";
  if (value !== "strict" && value !== "relaxed") throw new BenchUsageError(`--durability must be strict or relaxed, not ${JSON.stringify(value)}`);
  return value;
}

/** The --durability option every bench takes, for parseArgs. */
export const DURABILITY_OPTION = { durability: { type: "string" } } as const;

/**
 * The statement a raw baseline transaction runs after BEGIN so it commits as Keel's do in the same
 * mode: nothing for strict (a synchronous commit), `SET LOCAL synchronous_commit = off` for relaxed.
 * Like for like: a relaxed Keel beside a synchronous raw transaction would flatter Keel.
 */
export function rawCommitSetting(durability: Durability): string | undefined {
  return durability === "relaxed" ? "SET LOCAL synchronous_commit = off" : undefined;
}

/** BEGIN for a raw baseline transaction in `durability`'s commit mode. */
export async function beginRaw(db: { query(text: string): Promise<unknown> }, durability: Durability): Promise<void> {
  await db.query("BEGIN");
  const setting = rawCommitSetting(durability);
  if (setting !== undefined) await db.query(setting);
}

/** How the bench header names the mode, e.g. "Keel durability=strict, raw baseline commits synchronously". */
export function durabilityLabel(durability: Durability): string {
  return `Keel durability=${durability}, raw baseline ${durability === "strict" ? "commits synchronously" : "with synchronous_commit=off"}`;
}

/** A Keel served from this process on the bench's PostgreSQL, with one agent and a connector token. */
export interface BenchKeel {
  readonly app: KeelApp;
  readonly config: KeelConfig;
  readonly url: string;
  readonly token: string;
}

/**
 * Builds Keel as `keel serve` runs it, in `durability` (settings from KEEL_WORKERS, KEEL_DB_POOL_MAX,
 * KEEL_IDLE_POLL_MS and KEEL_LEASE_MS when set), puts `agent`, listens on loopback and starts the
 * workers, with the garbage-collector headroom `keel serve` gives its process. The caller stops
 * `app`; if starting fails, it is stopped here.
 */
export async function startBenchKeel(
  postgres: BenchPostgres,
  agent: AgentSpec,
  durability: Durability,
  options: Pick<BuildOptions, "wrapRunnerDeps"> = {},
): Promise<BenchKeel> {
  const env = {
    DATABASE_URL: postgres.url,
    KEEL_LOG_LEVEL: "warn",
    KEEL_DURABILITY: durability,
    ...pick(process.env, ["KEEL_WORKERS", "KEEL_DB_POOL_MAX", "KEEL_IDLE_POLL_MS", "KEEL_LEASE_MS"]),
  };
  const config = loadConfig(env);
  allowHeapGrowthForStreaming();
  const app = await buildApp(config, env, { log: pino({ level: "warn" }, pino.destination(2)), ...options });
  try {
    await app.agents.put(agent);
    const { secret: token } = await app.tokens.create("connector", "bench", { scope: { kind: "connector", connectors: "any", agents: "any" } });
    const { url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
    app.startWorkers();
    return { app, config, url, token };
  } catch (error) {
    await app.stop();
    throw error;
  }
}
