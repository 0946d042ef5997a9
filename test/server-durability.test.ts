// Keel's sessions on servers whose own synchronous_commit would weaken KEEL_DURABILITY: the shared
// test PostgreSQL runs with synchronous_commit and fsync off (global-setup.ts), so a session that
// merely inherited the server's setting would skip every flush strict mode promises.
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { sql } from "../control-plane/src/ledger/sql-text.js";
import { startKeelServe, type ServerProcess } from "./support/child-processes.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { logLines } from "./support/log-lines.js";

const started: TestKeel[] = [];
const processes: ServerProcess[] = [];
afterAll(async () => {
  for (const keel of started.splice(0)) await keel.stop();
  for (const child of processes.splice(0)) await child.kill();
});

/** A setting as a session of each of Keel's pools sees it: the plain one and the generic-plan one. */
async function sessionSettings(keel: TestKeel, name = "synchronous_commit"): Promise<{ plain: string; generic: string }> {
  const show = sql`SELECT current_setting(${name}) AS value`;
  const [plain] = await keel.app.ledger.sql.query<{ value: string }>(show);
  const generic = await keel.app.ledger.sql.transaction((trx) => trx.query<{ value: string }>(show), undefined, { plans: "generic" });
  return { plain: plain!.value, generic: generic[0]!.value };
}

describe("server durability settings", () => {
  it("a server with synchronous_commit off: Keel's sessions turn it on, and the log says so and warns of fsync off", async () => {
    const { log, lines } = logLines("info");
    const keel = await startTestKeel({ log, workers: 0 });
    started.push(keel);
    const server = new pg.Client({ connectionString: keel.databaseUrl });
    await server.connect();
    const { rows } = await server.query<{ value: string }>("SELECT current_setting('synchronous_commit') AS value");
    await server.end();
    expect(rows[0]!.value).toBe("off");
    expect(await sessionSettings(keel)).toEqual({ plain: "on", generic: "on" });
    const said = lines.map((line) => JSON.parse(line) as { level: number; msg: string });
    expect(said.filter((line) => line.msg.includes("synchronous_commit is off"))).toHaveLength(1);
    expect(said.filter((line) => line.msg.includes("fsync off") && line.level === 40)).toHaveLength(1);
  });

  it("a database whose synchronous_commit is local keeps it: Keel lowers nothing and raises only off", async () => {
    const url = await createTestDatabase();
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    await admin.query(`ALTER DATABASE ${new URL(url).pathname.slice(1)} SET synchronous_commit = 'local'`);
    await admin.end();
    const { log, lines } = logLines("info");
    const keel = await startTestKeel({ databaseUrl: url, log, workers: 0 });
    started.push(keel);
    expect(await sessionSettings(keel)).toEqual({ plain: "local", generic: "local" });
    expect(lines.some((line) => line.includes("synchronous_commit is off"))).toBe(false);
  });

  it("a URL's own startup options are kept, and cannot turn the flush off", async () => {
    const url = new URL(await createTestDatabase());
    url.searchParams.set("options", "-c synchronous_commit=off -c statement_timeout=54321");
    const keel = await startTestKeel({ databaseUrl: url.toString(), workers: 0 });
    started.push(keel);
    expect(await sessionSettings(keel)).toEqual({ plain: "on", generic: "on" });
    expect(await sessionSettings(keel, "statement_timeout")).toEqual({ plain: "54321ms", generic: "54321ms" });
    expect(await sessionSettings(keel, "plan_cache_mode")).toEqual({ plain: "auto", generic: "force_generic_plan" });
  });

  it("keel serve says its durability mode and that it turned the server's synchronous_commit on", { timeout: 60_000 }, async () => {
    const serve = await startKeelServe(["--port", "0", "--http1-port", "0"], { DATABASE_URL: await createTestDatabase(), KEEL_LOG_LEVEL: "info", KEEL_WORKERS: "0" });
    processes.push(serve);
    const entries = serve.output.flatMap((line) => {
      try {
        return [JSON.parse(line) as { msg?: string; durability?: string }];
      } catch {
        return [];
      }
    });
    expect(entries.find((entry) => entry.msg?.startsWith("keel is serving"))?.durability).toBe("strict");
    expect(entries.filter((entry) => entry.msg?.includes("synchronous_commit is off"))).toHaveLength(1);
  });
});
