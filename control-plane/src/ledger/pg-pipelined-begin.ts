import { createRequire } from "node:module";
import pg from "pg";

/**
 * BEGIN (with any SET LOCAL that opens the transaction) sent in the same round trip as its first statement. This drives pg's
 * extended-protocol Query from the inside (its prepare and handleCommandComplete, and the
 * connection's parsedStatements), which pg does not promise to keep: it is checked against the
 * pinned version below, and test/sql-transactions.test.ts fails loudly when that check does.
 * When the internals are not what this expects, transactions fall back to a separate BEGIN.
 */
export const PIPELINED_BEGIN_PG_VERSION = "8.20.0";

/** The parts of pg's Connection and Query that BeginThenQuery drives (pg 8's extended-protocol messages). */
interface WireConnection {
  readonly parsedStatements: Record<string, string>;
  parse(message: { text: string; name: string; types: unknown[] }): void;
  bind(message: { portal: string; statement: string; values: unknown[] }): void;
  execute(message: { portal: string; rows: number }): void;
}
interface PgQueryInternals {
  prepare(connection: WireConnection): void;
  handleCommandComplete(message: unknown, connection: WireConnection): void;
}
type QueryCallback = (error: Error | null, result?: pg.QueryResult) => void;
type PgQueryConstructor = new (config: pg.QueryConfig & { queryMode: "extended"; callback: QueryCallback }) => pg.Submittable & PgQueryInternals;
const PgQuery = pg.Query as unknown as PgQueryConstructor;

function installedPgVersion(): string {
  const require = createRequire(import.meta.url);
  return (require("pg/package.json") as { version: string }).version;
}

/** Why pipelining is off, or undefined when pg is the version and shape it was written against. */
export function pipelinedBeginUnsupportedReason(): string | undefined {
  const version = installedPgVersion();
  if (version !== PIPELINED_BEGIN_PG_VERSION) return `pg is ${version}, pipelined BEGIN was checked against ${PIPELINED_BEGIN_PG_VERSION}`;
  const prototype = (pg.Query as unknown as { prototype: Partial<PgQueryInternals> }).prototype;
  if (typeof prototype.prepare !== "function") return "pg.Query has no prepare()";
  if (typeof prototype.handleCommandComplete !== "function") return "pg.Query has no handleCommandComplete()";
  return undefined;
}

const supported = pipelinedBeginUnsupportedReason() === undefined;

class BeginThenQuery extends PgQuery {
  /** The statements that open the transaction, BEGIN first; none of them returns rows. */
  opening: readonly string[] = ["BEGIN"];
  private openingCompleted = 0;

  override prepare(connection: WireConnection): void {
    // The unnamed statement and portal: each opening statement is done with both before the next binds.
    for (const text of this.opening) {
      connection.parse({ text, name: "", types: [] });
      connection.bind({ portal: "", statement: "", values: [] });
      connection.execute({ portal: "", rows: 0 });
    }
    super.prepare(connection);
  }

  // The opening statements' CommandCompletes are the only extra replies; an error in any aborts the transaction.
  override handleCommandComplete(message: unknown, connection: WireConnection): void {
    if (this.openingCompleted < this.opening.length) {
      this.openingCompleted++;
      return;
    }
    super.handleCommandComplete(message, connection);
  }
}

/**
 * pg records a named statement as parsed on the first ParseComplete its query sees, which here
 * would be BEGIN's: a named statement not yet prepared on this connection gets BEGIN on its own.
 */
function mayPipeline(client: pg.PoolClient, text: string, name: string | undefined): boolean {
  if (!supported) return false;
  if (name === undefined) return true;
  const connection = (client as unknown as { connection?: WireConnection }).connection;
  return connection?.parsedStatements[name] === text;
}

/**
 * Runs the opening statements (BEGIN, then any SET LOCAL) and then the statement, in one round
 * trip where pg allows it, else in two.
 */
export async function beginWith(client: pg.PoolClient, config: pg.QueryConfig, opening: readonly string[] = ["BEGIN"]): Promise<pg.QueryResult> {
  if (!mayPipeline(client, config.text, config.name)) {
    // The simple protocol runs several statements in one message.
    await client.query(opening.join("; "));
    return client.query(config);
  }
  return new Promise<pg.QueryResult>((resolve, reject) => {
    const query = new BeginThenQuery({
      ...config,
      queryMode: "extended",
      callback: (error, done) => (error || done === undefined ? reject(error ?? new Error("no result")) : resolve(done)),
    });
    query.opening = opening;
    client.query(query);
  });
}
