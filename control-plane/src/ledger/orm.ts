import { MikroORM } from "@mikro-orm/postgresql";
import { Migrator } from "@mikro-orm/migrations";
import { ledgerEntities } from "./entities/index.js";
import { ledgerMigrations } from "./migrations/index.js";

export interface LedgerMigrationOptions {
  readonly url: string;
  readonly debug?: boolean;
  /** Where MikroORM's own messages (migrations applied) go; silent by default. */
  readonly log?: (message: string) => void;
}

/**
 * MikroORM's configuration: the entities (the schema's one description), the migrations and the
 * migrator. Only the start-up migration, the CLI (migration:create) and the schema tests use it;
 * at run time every query goes through the SQL pool (sql.ts).
 */
export function ledgerConfig(options: LedgerMigrationOptions) {
  return {
    clientUrl: options.url,
    entities: [...ledgerEntities],
    extensions: [Migrator],
    // Migrations run one after another on one connection.
    pool: { min: 0, max: 1 },
    debug: options.debug ?? false,
    logger: options.log ?? (() => {}),
    // Messages go into JSON log lines; terminal colour codes would only garble them.
    colors: false,
    // No entity is loaded through an EntityManager; any use of the global one is a bug.
    allowGlobalContext: false,
    discovery: { warnWhenNoEntities: true },
    migrations: {
      tableName: "keel_migrations",
      path: "control-plane/src/ledger/migrations",
      pathTs: "control-plane/src/ledger/migrations",
      migrationsList: ledgerMigrations,
      transactional: true,
      allOrNothing: true,
      snapshot: false,
      emit: "ts" as const,
    },
  };
}

/** Brings the schema up to date (every start runs this), then closes MikroORM's connection. */
export async function migrateLedger(options: LedgerMigrationOptions): Promise<void> {
  const orm = await MikroORM.init(ledgerConfig(options));
  try {
    await orm.getMigrator().up();
  } finally {
    await orm.close();
  }
}
