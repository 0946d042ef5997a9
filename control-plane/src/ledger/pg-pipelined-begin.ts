import { createRequire } from "node:module";
import pg from "pg";

/**
 * A transaction's opening (BEGIN, with any SET LOCAL) sent in the same round trip as its first
 * statement, its COMMIT in the same round trip as its last, and statements that need nothing
 * from each other sent together. This drives pg's extended-protocol Query from the inside (its
 * prepare, _getRows and handleCommandComplete, the connection's parsedStatements, and the value
 * mapping pg's own bind uses), which pg does not promise to keep: it is checked against the
 * pinned version below, and test/sql-transactions.test.ts fails loudly when that check does.
 * When the internals are not what this expects, every statement goes on its own.
 */
export const PIPELINED_BEGIN_PG_VERSION = "8.20.0";

/** The parts of pg's Connection and Query that PipelinedQuery drives (pg 8's extended-protocol messages). */
interface WireConnection {
  readonly parsedStatements: Record<string, string>;
  parse(message: { text: string; name: string; types: unknown[] }): void;
  bind(message: { portal: string; statement: string; values: unknown[]; valueMapper?: (value: unknown) => unknown }): void;
  describe(message: { type: "P"; name: string }): void;
  execute(message: { portal: string; rows: number }): void;
  sync(): void;
}
interface PgQueryInternals {
  prepare(connection: WireConnection): void;
  handleCommandComplete(message: unknown, connection: WireConnection): void;
  _getRows(connection: WireConnection, rows: number | undefined): void;
}
type QueryCallback = (error: Error | null, result?: pg.QueryResult | pg.QueryResult[]) => void;
type PgQueryConstructor = new (config: pg.QueryConfig & { queryMode: "extended"; callback: QueryCallback }) => pg.Submittable & PgQueryInternals;
const PgQuery = pg.Query as unknown as PgQueryConstructor;

const require = createRequire(import.meta.url);

function installedPgVersion(): string {
  return (require("pg/package.json") as { version: string }).version;
}

/** How pg turns a JavaScript value into a parameter (pg/lib/utils), for the statements sent ahead. */
const prepareValue = (() => {
  try {
    return (require("pg/lib/utils") as { prepareValue?: (value: unknown) => unknown }).prepareValue;
  } catch {
    return undefined;
  }
})();

/** Why pipelining is off, or undefined when pg is the version and shape it was written against. */
export function pipelinedBeginUnsupportedReason(): string | undefined {
  const version = installedPgVersion();
  if (version !== PIPELINED_BEGIN_PG_VERSION) return `pg is ${version}, pipelined BEGIN was checked against ${PIPELINED_BEGIN_PG_VERSION}`;
  const prototype = (pg.Query as unknown as { prototype: Partial<PgQueryInternals> }).prototype;
  if (typeof prototype.prepare !== "function") return "pg.Query has no prepare()";
  if (typeof prototype.handleCommandComplete !== "function") return "pg.Query has no handleCommandComplete()";
  if (typeof prototype._getRows !== "function") return "pg.Query has no _getRows()";
  if (typeof prepareValue !== "function") return "pg/lib/utils has no prepareValue()";
  return undefined;
}

const supported = pipelinedBeginUnsupportedReason() === undefined;

/** A named statement sent ahead of the query's own, with its values. */
interface Ahead {
  readonly name: string;
  readonly values: readonly unknown[];
}

class PipelinedQuery extends PgQuery {
  /** Statements that open the transaction, BEGIN first; none of them returns rows. */
  opening: readonly string[] = [];
  /** Named statements, already prepared on the connection, run before the query's own. */
  ahead: readonly Ahead[] = [];
  /** Statements after the query's own (COMMIT); none of them returns rows. */
  closing: readonly string[] = [];
  private openingCompleted = 0;
  private resultsCompleted = 0;

  override prepare(connection: WireConnection): void {
    // The unnamed statement and portal: each statement is done with the portal before the next binds.
    for (const text of this.opening) {
      connection.parse({ text, name: "", types: [] });
      connection.bind({ portal: "", statement: "", values: [] });
      connection.execute({ portal: "", rows: 0 });
    }
    for (const { name, values } of this.ahead) {
      connection.bind({ portal: "", statement: name, values: [...values], valueMapper: prepareValue! });
      connection.describe({ type: "P", name: "" });
      connection.execute({ portal: "", rows: 0 });
    }
    super.prepare(connection);
  }

  // The query's own Execute, then the closing statements, then the one Sync: after an error
  // PostgreSQL skips everything up to the Sync, so a failed statement is never committed.
  override _getRows(connection: WireConnection, rows: number | undefined): void {
    if (this.closing.length === 0 || rows !== undefined) {
      super._getRows(connection, rows);
      return;
    }
    connection.execute({ portal: "", rows: 0 });
    for (const text of this.closing) {
      connection.parse({ text, name: "", types: [] });
      connection.bind({ portal: "", statement: "", values: [] });
      connection.execute({ portal: "", rows: 0 });
    }
    connection.sync();
  }

  // The opening and closing statements' CommandCompletes carry nothing; each statement between
  // them is one result of the query's (pg keeps several in order). An error in any aborts the transaction.
  override handleCommandComplete(message: unknown, connection: WireConnection): void {
    if (this.openingCompleted < this.opening.length) {
      this.openingCompleted++;
      return;
    }
    if (this.resultsCompleted > this.ahead.length) return;
    this.resultsCompleted++;
    super.handleCommandComplete(message, connection);
  }
}

/**
 * pg records a named statement as parsed on the first ParseComplete its query sees, which here
 * would be the opening's: every named statement must be prepared on this connection already (its
 * first use goes on its own).
 */
function mayPipeline(client: pg.PoolClient, configs: readonly pg.QueryConfig[]): boolean {
  if (!supported) return false;
  const connection = (client as unknown as { connection?: WireConnection }).connection;
  return configs.every(({ name, text }, i) => (name === undefined ? i === configs.length - 1 : connection?.parsedStatements[name] === text));
}

/**
 * Runs the opening statements (BEGIN, then any SET LOCAL), then each statement in order, then the
 * closing ones (COMMIT), in one round trip where pg allows it. Each statement still runs after
 * the one before it has finished (and in READ COMMITTED, on a snapshot taken then). Only the last
 * of `configs` may be unnamed. When one fails, nothing after it runs (the closing ones neither).
 */
export async function pipeline(
  client: pg.PoolClient,
  configs: readonly pg.QueryConfig[],
  opening: readonly string[] = [],
  closing: readonly string[] = [],
): Promise<pg.QueryResult[]> {
  if (configs.length === 0) throw new Error("pipeline: no statement");
  if (!mayPipeline(client, configs)) {
    // The simple protocol runs several statements in one message.
    if (opening.length > 0) await client.query(opening.join("; "));
    const results: pg.QueryResult[] = [];
    for (const config of configs) results.push(await client.query(config));
    if (closing.length > 0) await client.query(closing.join("; "));
    return results;
  }
  const last = configs[configs.length - 1]!;
  return new Promise<pg.QueryResult[]>((resolve, reject) => {
    const query = new PipelinedQuery({
      ...last,
      queryMode: "extended",
      callback: (error, done) => {
        if (error || done === undefined) reject(error ?? new Error("no result"));
        else resolve(Array.isArray(done) ? done : [done]);
      },
    });
    query.opening = opening;
    query.ahead = configs.slice(0, -1).map(({ name, values }) => ({ name: name!, values: values ?? [] }));
    query.closing = closing;
    client.query(query);
  });
}

