import path from "node:path";
import { z } from "zod";
import { DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS } from "./domain/run-start.js";

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

/** Every setting, its environment variable and its default. Nothing is unbounded. */
const ConfigSchema = z.object({
  KEEL_HOST: z.string().min(1).default("127.0.0.1"),
  KEEL_PORT: int(0, 65535).default(7070),
  KEEL_HTTP1_PORT: int(0, 65535).default(7071),
  KEEL_DATA_DIR: z.string().min(1).default(".keel"),
  DATABASE_URL: z.string().regex(/^postgres(ql)?:\/\//, "must be a postgres:// URL").optional(),
  KEEL_EMBEDDED_PG_PORT: int(1024, 65535).default(54320),
  KEEL_DB_POOL_MAX: int(2, 200).default(20),
  KEEL_WORKERS: int(0, 256).default(8),
  KEEL_LEASE_MS: int(200, 3_600_000).default(15_000),
  KEEL_IDLE_POLL_MS: int(50, 60_000).default(2_000),
  KEEL_READ_FLUSH_MS: int(0, 10_000).default(100),
  KEEL_MAX_MESSAGE_BYTES: int(1024, 64 * 1024 * 1024).default(4 * 1024 * 1024),
  KEEL_MAX_TEXT_BYTES: int(16, 16 * 1024 * 1024).default(256 * 1024),
  KEEL_DEFAULT_DEADLINE_MS: int(100, 3_600_000).default(30_000),
  KEEL_MAX_DEADLINE_MS: int(100, 3_600_000).default(300_000),
  KEEL_LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  KEEL_MAX_CONCURRENT_ROOT_RUNS: int(1, 100_000).default(DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS),
  KEEL_SANDBOX_HEARTBEAT_MS: int(100, 300_000).default(5_000),
  KEEL_SANDBOX_RECONNECT_GRACE_MS: int(0, 600_000).default(5_000),
  KEEL_SANDBOX_PLACEMENT_WAIT_MS: int(0, 600_000).default(30_000),
  KEEL_SANDBOX_REATTACH_WAIT_MS: int(0, 600_000).default(20_000),
  KEEL_SANDBOX_KEEP_MS: int(0, 7 * 24 * 3_600_000).default(600_000),
  KEEL_SANDBOX_SWEEP_MS: int(50, 3_600_000).default(5_000),
  KEEL_SANDBOX_MAX_OUTPUT_BYTES: int(1024, 256 * 1024 * 1024).default(1024 * 1024),
  KEEL_SANDBOX_EXEC_TIMEOUT_MS: int(100, 24 * 3_600_000).default(120_000),
  KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS: int(100, 24 * 3_600_000).default(1_800_000),
});

export type KeelConfig = Readonly<{
  host: string;
  port: number;
  http1Port: number;
  dataDir: string;
  databaseUrl: string | undefined;
  embeddedPgPort: number;
  dbPoolMax: number;
  workers: number;
  leaseMs: number;
  /** How long a read's result may wait to ride with the run's next commit; 0: every result commits on its own. */
  readFlushMs: number;
  idlePollMs: number;
  maxMessageBytes: number;
  maxTextBytes: number;
  defaultDeadlineMs: number;
  maxDeadlineMs: number;
  logLevel: z.infer<typeof ConfigSchema>["KEEL_LOG_LEVEL"];
  /** The install's ceiling on root runs executing at once, across agents (each agent has its own too). */
  maxConcurrentRootRuns: number;
  sandbox: SandboxConfig;
}>;

export type SandboxConfig = Readonly<{
  /** How often hosts send heartbeats; three missed ones detach the host. */
  heartbeatMs: number;
  /** How long a host that dropped off may take to re-attach before its in-flight commands' outcomes are unknown. */
  reconnectGraceMs: number;
  /** How long a tool waits for an attached host with room before it fails. */
  placementWaitMs: number;
  /** How long recovery waits for the host of an interrupted exec to come back and report it. */
  reattachWaitMs: number;
  /** How long a finished run's workspace is kept for inspection before it is released. */
  keepMs: number;
  sweepMs: number;
  maxOutputBytes: number;
  defaultExecTimeoutMs: number;
  maxExecTimeoutMs: number;
}>;

export class ConfigError extends Error {}

/** Reads the environment. An invalid setting throws one line naming it. */
export function loadConfig(env: Readonly<Record<string, string | undefined>>): KeelConfig {
  const present = Object.fromEntries(Object.entries(env).filter(([key, value]) => key in ConfigSchema.shape && value !== ""));
  const parsed = ConfigSchema.safeParse(present);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new ConfigError(`invalid setting ${String(issue.path[0])}=${JSON.stringify(env[String(issue.path[0])])}: ${issue.message}`);
  }
  const c = parsed.data;
  if (c.KEEL_DEFAULT_DEADLINE_MS > c.KEEL_MAX_DEADLINE_MS) {
    throw new ConfigError("invalid setting KEEL_DEFAULT_DEADLINE_MS: must not exceed KEEL_MAX_DEADLINE_MS");
  }
  if (c.KEEL_SANDBOX_EXEC_TIMEOUT_MS > c.KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS) {
    throw new ConfigError("invalid setting KEEL_SANDBOX_EXEC_TIMEOUT_MS: must not exceed KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS");
  }
  return {
    host: c.KEEL_HOST,
    port: c.KEEL_PORT,
    http1Port: c.KEEL_HTTP1_PORT,
    dataDir: path.resolve(c.KEEL_DATA_DIR),
    databaseUrl: c.DATABASE_URL,
    embeddedPgPort: c.KEEL_EMBEDDED_PG_PORT,
    dbPoolMax: c.KEEL_DB_POOL_MAX,
    workers: c.KEEL_WORKERS,
    leaseMs: c.KEEL_LEASE_MS,
    idlePollMs: c.KEEL_IDLE_POLL_MS,
    readFlushMs: c.KEEL_READ_FLUSH_MS,
    maxMessageBytes: c.KEEL_MAX_MESSAGE_BYTES,
    maxTextBytes: c.KEEL_MAX_TEXT_BYTES,
    defaultDeadlineMs: c.KEEL_DEFAULT_DEADLINE_MS,
    maxDeadlineMs: c.KEEL_MAX_DEADLINE_MS,
    logLevel: c.KEEL_LOG_LEVEL,
    maxConcurrentRootRuns: c.KEEL_MAX_CONCURRENT_ROOT_RUNS,
    sandbox: {
      heartbeatMs: c.KEEL_SANDBOX_HEARTBEAT_MS,
      reconnectGraceMs: c.KEEL_SANDBOX_RECONNECT_GRACE_MS,
      placementWaitMs: c.KEEL_SANDBOX_PLACEMENT_WAIT_MS,
      reattachWaitMs: c.KEEL_SANDBOX_REATTACH_WAIT_MS,
      keepMs: c.KEEL_SANDBOX_KEEP_MS,
      sweepMs: c.KEEL_SANDBOX_SWEEP_MS,
      maxOutputBytes: c.KEEL_SANDBOX_MAX_OUTPUT_BYTES,
      defaultExecTimeoutMs: c.KEEL_SANDBOX_EXEC_TIMEOUT_MS,
      maxExecTimeoutMs: c.KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS,
    },
  };
}
