import { availableParallelism } from "node:os";
import path from "node:path";
import { z } from "zod";
import { isLoopbackHost } from "../../common/loopback.js";
import { INSTALL_SETTING_FIELDS, type InstallSettingsChange } from "./domain/install-settings.js";

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const flag = z.enum(["1", "true", "yes", "0", "false", "no"]).transform((value) => ["1", "true", "yes"].includes(value));

/** Every setting, its environment variable and its default. Nothing is unbounded. */
const ConfigSchema = z.object({
  KEEL_HOST: z.string().min(1).default("127.0.0.1"),
  KEEL_PORT: int(0, 65535).default(7070),
  KEEL_HTTP1_PORT: int(0, 65535).default(7071),
  KEEL_TLS_CERT: z.string().min(1).optional(),
  KEEL_TLS_KEY: z.string().min(1).optional(),
  KEEL_TLS_CLIENT_CA: z.string().min(1).optional(),
  KEEL_INSECURE: flag.default(false),
  // Past this many open streams a connection's new ones are refused, and Node closes a connection
  // after 100 refusals: well above what one client needs (a connector's Subscribe, WatchRun streams).
  KEEL_HTTP2_MAX_CONCURRENT_STREAMS: int(1, 10_000).default(1_000),
  KEEL_HTTP2_IDLE_TIMEOUT_MS: int(1_000, 3_600_000).default(120_000),
  KEEL_MAX_HEADER_BYTES: int(1024, 1024 * 1024).default(16 * 1024),
  // Behind a TCP load balancer every client shares its address: the cap is for the balancer's
  // connections then, so it is set well above what one client opens.
  KEEL_MAX_SESSIONS_PER_ADDRESS: int(1, 100_000).default(1_024),
  // Calls without a valid token are answered at this rate at most (a tenth of it at once); past
  // it they wait, so a flood of them cannot take the CPU authorized calls need.
  KEEL_REFUSALS_PER_SECOND: int(10, 1_000_000).default(1_000),
  // Refusals a second (a second's worth at once) before a connection that never made an
  // authorized call is held unread when refused (unproven-intake.ts).
  KEEL_REFUSAL_BUDGET_PER_SECOND: int(1, 1_000_000).default(200),
  KEEL_DATA_DIR: z.string().min(1).default(".keel"),
  DATABASE_URL: z.string().regex(/^postgres(ql)?:\/\//, "must be a postgres:// URL").optional(),
  KEEL_EMBEDDED_PG_PORT: int(1024, 65535).default(54320),
  KEEL_EMBEDDED_PG_LISTEN: z.string().max(1024).regex(/^[^\s'"]*$/, "must be a comma-separated address list").default(""),
  KEEL_DB_POOL_MAX: int(2, 200).default(20),
  KEEL_WORKERS: int(0, 256).default(32),
  KEEL_LEASE_MS: int(200, 3_600_000).default(15_000),
  KEEL_IDLE_POLL_MS: int(50, 60_000).default(2_000),
  KEEL_MAX_STREAMS_PER_TOKEN: int(1, 100_000).default(256),
  KEEL_READ_FLUSH_MS: int(0, 10_000).default(100),
  KEEL_SPECULATIVE_START: flag.default(true),
  KEEL_DURABILITY: z.enum(["strict", "relaxed"]).default("strict"),
  // A lone step commit's reply is polled for this long before the process sleeps (group-commit.ts).
  // Off with one CPU, where polling would take the CPU the database needs to answer.
  KEEL_COMMIT_POLL_MS: int(0, 100).default(() => (availableParallelism() > 1 ? 2 : 0)),
  KEEL_MAX_MESSAGE_BYTES: int(1024, 64 * 1024 * 1024).default(4 * 1024 * 1024),
  KEEL_MAX_TEXT_BYTES: int(16, 16 * 1024 * 1024).default(256 * 1024),
  KEEL_DEFAULT_DEADLINE_MS: int(100, 3_600_000).default(30_000),
  KEEL_MAX_DEADLINE_MS: int(100, 3_600_000).default(300_000),
  KEEL_LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  // Deprecated: install-wide settings live in the ledger (install-settings-env.ts says what these still do).
  KEEL_MAX_CONCURRENT_ROOT_RUNS: int(INSTALL_SETTING_FIELDS.rootRunCeiling.min, INSTALL_SETTING_FIELDS.rootRunCeiling.max).optional(),
  KEEL_RETENTION_DAYS: int(INSTALL_SETTING_FIELDS.retentionDays.min, INSTALL_SETTING_FIELDS.retentionDays.max).optional(),
  KEEL_SECRET_ENV_PREFIXES: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$/, "must be variable-name prefixes, comma-separated").default("KEEL_SECRET_"),
  KEEL_MODEL_ENDPOINTS: z.string().max(8192).default(""),
  KEEL_RETENTION_SWEEP_MS: int(1_000, 86_400_000).default(3_600_000),
  KEEL_SANDBOX_HEARTBEAT_MS: int(100, 300_000).default(5_000),
  KEEL_SANDBOX_RECONNECT_GRACE_MS: int(0, 600_000).default(5_000),
  KEEL_SANDBOX_PLACEMENT_WAIT_MS: int(0, 600_000).default(30_000),
  KEEL_SANDBOX_REATTACH_WAIT_MS: int(0, 600_000).default(20_000),
  KEEL_SANDBOX_REGISTRATION_WAIT_MS: int(100, 600_000).default(10_000),
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
  /** Certificate and key files for both listeners; undefined: plaintext (loopback only unless insecure). */
  tls: TlsFiles | undefined;
  /** Plaintext on a non-loopback address was accepted explicitly. */
  insecure: boolean;
  http2: Http2Limits;
  dataDir: string;
  databaseUrl: string | undefined;
  embeddedPgPort: number;
  /** The embedded PostgreSQL's listen_addresses: "" (its Unix socket only) unless set. */
  embeddedPgListen: string;
  dbPoolMax: number;
  workers: number;
  leaseMs: number;
  /** How long a read's result may wait to ride with the run's next commit; 0: every result commits on its own. */
  readFlushMs: number;
  /**
   * A new request to a conversation this process last saw quiet starts its first model call
   * before admission reads the conversation; a guess the read disproves aborts the call.
   */
  speculativeStart: boolean;
  /**
   * strict: every commit that records a step, model call, tool result, artifact, claim or emission
   * waits for its WAL flush. relaxed: replayable work (read-only steps, read results, claims) does not (README, "Durability").
   */
  durability: "strict" | "relaxed";
  /** How long the event loop polls for a lone step commit's reply before it sleeps; 0: never. */
  commitPollMs: number;
  idlePollMs: number;
  /** Open Subscribe streams one token may hold. */
  maxStreamsPerToken: number;
  maxMessageBytes: number;
  maxTextBytes: number;
  defaultDeadlineMs: number;
  maxDeadlineMs: number;
  logLevel: z.infer<typeof ConfigSchema>["KEEL_LOG_LEVEL"];
  /**
   * Install-wide settings given by their deprecated variables (KEEL_MAX_CONCURRENT_ROOT_RUNS,
   * KEEL_RETENTION_DAYS). The ledger's values apply; these only seed a ledger nobody has set.
   */
  installSettingsFromEnv: InstallSettingsChange;
  /** Prefixes of the variables agent specs may read secrets and API keys from. */
  secretEnvPrefixes: readonly string[];
  /** Model base URLs agent specs may name (`loopback` for any on this machine). */
  modelEndpoints: readonly string[];
  sandbox: SandboxConfig;
  /** How often finished runs past the ledger's retention_days are looked for and deleted. */
  retention: Readonly<{ sweepMs: number }>;
}>;

export type TlsFiles = Readonly<{
  certFile: string;
  keyFile: string;
  /** When set, SandboxService calls need a client certificate signed by this CA (mTLS for sandbox hosts). */
  clientCaFile: string | undefined;
}>;

export type Http2Limits = Readonly<{
  /** Streams one connection may have open at once. */
  maxConcurrentStreams: number;
  /** A connection with no open stream and no traffic for this long is closed. */
  idleTimeoutMs: number;
  /** The largest header block a request may send. */
  maxHeaderBytes: number;
  /** Connections one remote address may hold at once; more are refused. */
  maxSessionsPerAddress: number;
  /** Calls without a valid token answered per second at most; past it they wait (refusal-pacer.ts). */
  refusalsPerSecond: number;
  /** Refusals per second before refused connections without an authorized call are held unread (unproven-intake.ts). */
  refusalBudgetPerSecond: number;
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
  /** How long a new Attach stream may take to send its registration before it is ended. */
  registrationWaitMs: number;
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
  if ((c.KEEL_TLS_CERT === undefined) !== (c.KEEL_TLS_KEY === undefined)) {
    throw new ConfigError("invalid setting KEEL_TLS_CERT/KEEL_TLS_KEY: give both the certificate and its key, or neither");
  }
  if (c.KEEL_TLS_CLIENT_CA !== undefined && c.KEEL_TLS_CERT === undefined) {
    throw new ConfigError("invalid setting KEEL_TLS_CLIENT_CA: client certificates need TLS (KEEL_TLS_CERT and KEEL_TLS_KEY)");
  }
  if (c.KEEL_TLS_CERT === undefined && !c.KEEL_INSECURE && !isLoopbackHost(c.KEEL_HOST)) {
    throw new ConfigError(
      `invalid setting KEEL_HOST=${JSON.stringify(c.KEEL_HOST)}: refusing to serve plaintext on an address that is not loopback; ` +
        "give --tls-cert and --tls-key (KEEL_TLS_CERT, KEEL_TLS_KEY), or --insecure (KEEL_INSECURE=1) to serve tokens unencrypted",
    );
  }
  return {
    host: c.KEEL_HOST,
    port: c.KEEL_PORT,
    http1Port: c.KEEL_HTTP1_PORT,
    tls:
      c.KEEL_TLS_CERT === undefined || c.KEEL_TLS_KEY === undefined
        ? undefined
        : { certFile: path.resolve(c.KEEL_TLS_CERT), keyFile: path.resolve(c.KEEL_TLS_KEY), clientCaFile: c.KEEL_TLS_CLIENT_CA === undefined ? undefined : path.resolve(c.KEEL_TLS_CLIENT_CA) },
    insecure: c.KEEL_INSECURE,
    http2: {
      maxConcurrentStreams: c.KEEL_HTTP2_MAX_CONCURRENT_STREAMS,
      idleTimeoutMs: c.KEEL_HTTP2_IDLE_TIMEOUT_MS,
      maxHeaderBytes: c.KEEL_MAX_HEADER_BYTES,
      maxSessionsPerAddress: c.KEEL_MAX_SESSIONS_PER_ADDRESS,
      refusalsPerSecond: c.KEEL_REFUSALS_PER_SECOND,
      refusalBudgetPerSecond: c.KEEL_REFUSAL_BUDGET_PER_SECOND,
    },
    dataDir: path.resolve(c.KEEL_DATA_DIR),
    databaseUrl: c.DATABASE_URL,
    embeddedPgPort: c.KEEL_EMBEDDED_PG_PORT,
    embeddedPgListen: c.KEEL_EMBEDDED_PG_LISTEN,
    dbPoolMax: c.KEEL_DB_POOL_MAX,
    workers: c.KEEL_WORKERS,
    leaseMs: c.KEEL_LEASE_MS,
    idlePollMs: c.KEEL_IDLE_POLL_MS,
    maxStreamsPerToken: c.KEEL_MAX_STREAMS_PER_TOKEN,
    readFlushMs: c.KEEL_READ_FLUSH_MS,
    speculativeStart: c.KEEL_SPECULATIVE_START,
    durability: c.KEEL_DURABILITY,
    commitPollMs: c.KEEL_COMMIT_POLL_MS,
    maxMessageBytes: c.KEEL_MAX_MESSAGE_BYTES,
    maxTextBytes: c.KEEL_MAX_TEXT_BYTES,
    defaultDeadlineMs: c.KEEL_DEFAULT_DEADLINE_MS,
    maxDeadlineMs: c.KEEL_MAX_DEADLINE_MS,
    logLevel: c.KEEL_LOG_LEVEL,
    installSettingsFromEnv: {
      ...(c.KEEL_MAX_CONCURRENT_ROOT_RUNS === undefined ? {} : { rootRunCeiling: c.KEEL_MAX_CONCURRENT_ROOT_RUNS }),
      ...(c.KEEL_RETENTION_DAYS === undefined ? {} : { retentionDays: c.KEEL_RETENTION_DAYS }),
    },
    secretEnvPrefixes: c.KEEL_SECRET_ENV_PREFIXES.split(","),
    modelEndpoints: c.KEEL_MODEL_ENDPOINTS.split(",").map((entry) => entry.trim()).filter((entry) => entry !== ""),
    retention: { sweepMs: c.KEEL_RETENTION_SWEEP_MS },
    sandbox: {
      heartbeatMs: c.KEEL_SANDBOX_HEARTBEAT_MS,
      reconnectGraceMs: c.KEEL_SANDBOX_RECONNECT_GRACE_MS,
      placementWaitMs: c.KEEL_SANDBOX_PLACEMENT_WAIT_MS,
      reattachWaitMs: c.KEEL_SANDBOX_REATTACH_WAIT_MS,
      registrationWaitMs: c.KEEL_SANDBOX_REGISTRATION_WAIT_MS,
      keepMs: c.KEEL_SANDBOX_KEEP_MS,
      sweepMs: c.KEEL_SANDBOX_SWEEP_MS,
      maxOutputBytes: c.KEEL_SANDBOX_MAX_OUTPUT_BYTES,
      defaultExecTimeoutMs: c.KEEL_SANDBOX_EXEC_TIMEOUT_MS,
      maxExecTimeoutMs: c.KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS,
    },
  };
}
