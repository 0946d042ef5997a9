import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/**
 * The install's settings that every replica must agree on: one row, id 1, created by its
 * migration. Statements that need a value read it by subquery (ledger/install-settings.sql.ts).
 */
export const InstallSettingsEntity = defineEntity({
  name: "InstallSettings",
  tableName: "install_settings",
  properties: {
    // Always 1: one row, never a sequence.
    id: p.integer().primary().autoincrement(false),
    rootRunCeiling: p.integer(),
    retentionDays: p.integer(),
    /** Who last set a value ("env KEEL_…" when seeded from a deprecated variable); null: the defaults. */
    updatedBy: p.text().nullable(),
    updatedAt: p.datetime().defaultRaw("now()"),
  },
});
