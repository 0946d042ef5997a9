// The entities are the schema's one description: a database migrated from scratch must be exactly
// what they say. An entity changed without a generated migration (or a migration without its
// entity change) fails here, printing the SQL that would close the gap.
import { MikroORM } from "@mikro-orm/postgresql";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerConfig, migrateLedger } from "../control-plane/src/ledger/orm.js";
import { createTestDatabase } from "./support/keel-fixture.js";

let orm: MikroORM;
beforeAll(async () => {
  const url = await createTestDatabase();
  await migrateLedger({ url });
  orm = await MikroORM.init(ledgerConfig({ url }));
});
afterAll(async () => {
  await orm?.close();
});

describe("schema drift between entities and migrations", () => {
  it("a freshly migrated database needs no change to match the entities", async () => {
    const diff = (await orm.schema.getUpdateSchemaSQL({ wrap: false })).trim();
    expect(
      diff,
      `the entities and the migrations disagree; add the change to an entity and run \`npm run migration:create\`. The difference:\n${diff}`,
    ).toBe("");
  });

  it("the migrator agrees that no migration is missing", async () => {
    expect(await orm.getMigrator().checkMigrationNeeded()).toBe(false);
  });
});
