// Issue #17 (found by the chaos suite): a PostgreSQL restart ends every connection, also one a
// transaction has checked out but is not running a statement on (a worker between two
// statements). pg then emits 'error' on that client, which the pool stops listening to while
// the client is checked out: a replica exited on the unhandled event. The transaction must fail
// on its next statement instead, the process go on, and the pool hand out a fresh connection.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createSqlPool, sql, type SqlPool } from "../control-plane/src/ledger/sql.js";
import { waitFor } from "./support/child-processes.js";
import { createTestDatabase } from "./support/keel-fixture.js";

describe("a transaction whose connection the server ends between two statements", () => {
  let pool: SqlPool;
  let admin: pg.Client;
  const uncaught: unknown[] = [];
  const onUncaught = (error: unknown) => uncaught.push(error);

  beforeAll(async () => {
    const url = await createTestDatabase();
    pool = createSqlPool({ url, max: 1 });
    admin = new pg.Client({ connectionString: url });
    await admin.connect();
    process.on("uncaughtException", onUncaught);
  });

  afterAll(async () => {
    process.off("uncaughtException", onUncaught);
    await admin?.end();
    await pool?.close();
  });

  it("fails the transaction, not the process, and the pool goes on", async () => {
    let pid = 0;
    const attempt = pool.transaction(async (trx) => {
      const [row] = await trx.query<{ pid: number }>(sql`SELECT pg_backend_pid() AS pid`);
      pid = row!.pid;
      await admin.query("SELECT pg_terminate_backend($1)", [pid]);
      // No statement runs on this connection while the server ends it.
      await waitFor("the terminated backend to exit", async () => ((await admin.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", [pid])).rowCount === 0 ? true : undefined));
      // Its socket closes as it exits; this gives the event loop time to read that end.
      await new Promise((resolve) => setTimeout(resolve, 300));
      return trx.query(sql`SELECT 1 AS one`);
    });
    await expect(attempt).rejects.toThrow(/not queryable|terminated/i);
    expect(uncaught).toEqual([]);
    // The lost connection was closed, not handed out again: the next transaction gets a live one.
    const [after] = await pool.transaction((trx) => trx.query<{ pid: number }>(sql`SELECT pg_backend_pid() AS pid`));
    expect(after!.pid).not.toBe(pid);
  });
});
