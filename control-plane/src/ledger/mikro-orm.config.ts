// For the MikroORM CLI only (migration:create). The server builds its config in orm.ts.
import { defineConfig } from "@mikro-orm/postgresql";
import { runningEmbeddedPostgresUrl } from "./embedded-postgres.js";
import { ledgerConfig } from "./orm.js";

export default defineConfig(
  ledgerConfig({ url: process.env["DATABASE_URL"] ?? runningEmbeddedPostgresUrl(".keel/postgres") ?? "postgresql://keel@127.0.0.1:54320/keel" }),
);
