// A migrated test database with one conversation seeded (run-seed.ts), a client on it and a Keel
// SQL pool, opened before a file's tests and closed after them.
import pg from "pg";
import { afterAll, beforeAll } from "vitest";
import { migrateLedger } from "../../control-plane/src/ledger/orm.js";
import { createSqlPool, type SqlPool } from "../../control-plane/src/ledger/sql.js";
import { createTestDatabase } from "./keel-fixture.js";
import { seedConversation } from "./run-seed.js";

export interface SeededLedger {
  readonly url: string;
  readonly db: pg.Client;
  readonly sql: SqlPool;
}

/** Call at a test file's top level; the fields are there once its beforeAll has run. */
export function seededLedger(owners: { readonly agent: string; readonly actor: string; readonly conversation: string }, poolMax = 2): SeededLedger {
  const ledger = {} as { url: string; db: pg.Client; sql: SqlPool };
  beforeAll(async () => {
    ledger.url = await createTestDatabase();
    await migrateLedger({ url: ledger.url });
    ledger.db = new pg.Client({ connectionString: ledger.url });
    await ledger.db.connect();
    await seedConversation(ledger.db, owners);
    ledger.sql = createSqlPool({ url: ledger.url, max: poolMax });
  });
  afterAll(async () => {
    await ledger.sql?.close();
    await ledger.db?.end();
  });
  return ledger;
}
