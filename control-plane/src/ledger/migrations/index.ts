import type { MigrationObject } from "@mikro-orm/core";
import { Migration20261130002410 } from "./Migration20261130002410.js";

/** Migrations in order. Generated with `npm run migration:create`, committed, never edited once landed. */
export const ledgerMigrations: MigrationObject[] = [{ name: "Migration20261130002410", class: Migration20261130002410 }];
