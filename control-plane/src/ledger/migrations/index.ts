import type { MigrationObject } from "@mikro-orm/core";
import { Migration20261130005606 } from "./Migration20261130005606.js";
import { Migration20261201000000 } from "./Migration20261201000000.js";
import { Migration20261202000000 } from "./Migration20261202000000.js";
import { Migration20261203000000 } from "./Migration20261203000000.js";
import { Migration20261204100000 } from "./Migration20261204100000.js";
import { Migration20261205000000 } from "./Migration20261205000000.js";
import { Migration20261206000000 } from "./Migration20261206000000.js";
import { Migration20261207000000 } from "./Migration20261207000000.js";
import { Migration20261207100000 } from "./Migration20261207100000.js";
import { Migration20261208000000 } from "./Migration20261208000000.js";
import { Migration20261210000000 } from "./Migration20261210000000.js";
import { Migration20261211000000 } from "./Migration20261211000000.js";
import { Migration20261212000000 } from "./Migration20261212000000.js";
import { Migration20261213000000 } from "./Migration20261213000000.js";
import { Migration20261214000000 } from "./Migration20261214000000.js";
import { Migration20261215000000 } from "./Migration20261215000000.js";
import { Migration20261216000000 } from "./Migration20261216000000.js";
import { Migration20261217000000 } from "./Migration20261217000000.js";
import { Migration20261218000000 } from "./Migration20261218000000.js";
import { Migration20261219000000 } from "./Migration20261219000000.js";
import { Migration20261220000000 } from "./Migration20261220000000.js";
import { Migration20261221000000 } from "./Migration20261221000000.js";
import { Migration20261222000000 } from "./Migration20261222000000.js";
import { Migration20261223000000 } from "./Migration20261223000000.js";
import { Migration20261224000000 } from "./Migration20261224000000.js";
import { Migration20261225000000 } from "./Migration20261225000000.js";
import { Migration20261226000000 } from "./Migration20261226000000.js";
import { Migration20261227000000 } from "./Migration20261227000000.js";
import { Migration20261228000000 } from "./Migration20261228000000.js";
import { Migration20261229000000 } from "./Migration20261229000000.js";
import { Migration20261230000000 } from "./Migration20261230000000.js";
import { Migration20261231000000 } from "./Migration20261231000000.js";

/**
 * Migrations in order, never edited once landed. Schema changes are generated from the entities
 * with `npm run migration:create` (test/schema-drift.test.ts fails when the two disagree); what
 * entities cannot describe (functions, triggers, column storage) is written by hand.
 */
export const ledgerMigrations: MigrationObject[] = [
  { name: "Migration20261130005606", class: Migration20261130005606 },
  { name: "Migration20261201000000", class: Migration20261201000000 },
  { name: "Migration20261202000000", class: Migration20261202000000 },
  { name: "Migration20261203000000", class: Migration20261203000000 },
  { name: "Migration20261204100000", class: Migration20261204100000 },
  { name: "Migration20261205000000", class: Migration20261205000000 },
  { name: "Migration20261206000000", class: Migration20261206000000 },
  { name: "Migration20261207000000", class: Migration20261207000000 },
  { name: "Migration20261207100000", class: Migration20261207100000 },
  { name: "Migration20261208000000", class: Migration20261208000000 },
  { name: "Migration20261210000000", class: Migration20261210000000 },
  { name: "Migration20261211000000", class: Migration20261211000000 },
  { name: "Migration20261212000000", class: Migration20261212000000 },
  { name: "Migration20261213000000", class: Migration20261213000000 },
  { name: "Migration20261214000000", class: Migration20261214000000 },
  { name: "Migration20261215000000", class: Migration20261215000000 },
  { name: "Migration20261216000000", class: Migration20261216000000 },
  { name: "Migration20261217000000", class: Migration20261217000000 },
  { name: "Migration20261218000000", class: Migration20261218000000 },
  { name: "Migration20261219000000", class: Migration20261219000000 },
  { name: "Migration20261220000000", class: Migration20261220000000 },
  { name: "Migration20261221000000", class: Migration20261221000000 },
  { name: "Migration20261222000000", class: Migration20261222000000 },
  { name: "Migration20261223000000", class: Migration20261223000000 },
  { name: "Migration20261224000000", class: Migration20261224000000 },
  { name: "Migration20261225000000", class: Migration20261225000000 },
  { name: "Migration20261226000000", class: Migration20261226000000 },
  { name: "Migration20261227000000", class: Migration20261227000000 },
  { name: "Migration20261228000000", class: Migration20261228000000 },
  { name: "Migration20261229000000", class: Migration20261229000000 },
  { name: "Migration20261230000000", class: Migration20261230000000 },
  { name: "Migration20261231000000", class: Migration20261231000000 },
];
