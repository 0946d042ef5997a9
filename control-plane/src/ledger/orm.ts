import { MikroORM } from "@mikro-orm/postgresql";
import { Migrator } from "@mikro-orm/migrations";
import { ledgerEntities } from "./entities/index.js";
import { ledgerMigrations } from "./migrations/index.js";

export type LedgerOrm = MikroORM;

export interface LedgerOptions {
  readonly url: string;
  readonly poolMax: number;
  readonly debug?: boolean;
  /** Where MikroORM's own messages (migrations applied) go; silent by default. */
  readonly log?: (message: string) => void;
}

export function ledgerConfig(options: LedgerOptions) {
  return {
    clientUrl: options.url,
    entities: [...ledgerEntities],
    extensions: [Migrator],
    pool: { min: 0, max: options.poolMax },
    debug: options.debug ?? false,
    logger: options.log ?? (() => {}),
    // Messages go into JSON log lines; terminal colour codes would only garble them.
    colors: false,
    // Every RPC and worker iteration forks its own EntityManager; the global one is a bug.
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

/** Connects and brings the schema up to date; migrations run at every start. */
export async function openLedger(options: LedgerOptions): Promise<LedgerOrm> {
  const orm = await MikroORM.init(ledgerConfig(options));
  await orm.getMigrator().up();
  return orm;
}
