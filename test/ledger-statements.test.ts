// Hot-path SQL stays hand-written, so nothing but PostgreSQL checks it against the schema: every
// statement() of the ledger is prepared here against a freshly migrated database, and a renamed
// column or table fails CI naming the statement, not at run time on the path that uses it.
import { readdir } from "node:fs/promises";
import path from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrateLedger } from "../control-plane/src/ledger/orm.js";
import { registeredStatements } from "../control-plane/src/ledger/sql.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const LEDGER = path.resolve(import.meta.dirname, "../control-plane/src/ledger");

let db: pg.Client;
beforeAll(async () => {
  // Importing a module defines (and registers) its statements.
  for (const file of await readdir(LEDGER, { recursive: true })) {
    if (file.endsWith(".ts") && !file.endsWith(".test.ts") && !file.startsWith("migrations")) await import(pathToFileURL(path.join(LEDGER, file)).href);
  }
  const url = await createTestDatabase();
  await migrateLedger({ url });
  db = new pg.Client({ connectionString: url });
  await db.connect();
});
afterAll(async () => {
  await db?.end();
});

describe("the ledger's statements against the migrated schema", () => {
  it("every registered statement prepares", async () => {
    const statements = registeredStatements();
    expect(statements.length).toBeGreaterThan(0);
    const failures: string[] = [];
    for (const statement of statements) {
      try {
        await db.query(`PREPARE ${statement.name} AS ${statement.text}`);
        await db.query(`DEALLOCATE ${statement.name}`);
      } catch (error) {
        failures.push(`${statement.name}: ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    expect(failures, `statements that do not prepare:\n${failures.join("\n")}`).toEqual([]);
  });
});
