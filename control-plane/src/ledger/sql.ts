import { createHash } from "node:crypto";
import pg from "pg";

/**
 * Keel's own SQL access: a plain `pg` pool, no query builder. Every hot path (claiming,
 * committing a step, admitting a message, streaming emissions) is hand-written SQL because it
 * leans on row locks, SKIP LOCKED and NOTIFY; going through a query builder and its pool cost
 * more CPU per statement than PostgreSQL spent running it. MikroORM keeps the schema (entities,
 * migrations) and the few entity repositories.
 *
 * Statements use `?` placeholders (every `?` is a parameter, as in the SQL written so far).
 */
export interface Sql {
  /** One statement; with `name`, a prepared statement (parsed and planned once per connection). */
  query<T = Record<string, unknown>>(text: string, bindings?: readonly unknown[], name?: string): Promise<T[]>;
  /** BEGIN … COMMIT on one connection; ROLLBACK when `work` throws. Inside a transaction, runs `work` in it. */
  transaction<T>(work: (trx: SqlTransaction) => Promise<T>): Promise<T>;
}

/** The same interface, bound to one connection inside BEGIN … COMMIT. */
export type SqlTransaction = Sql;

export interface SqlPool extends Sql {
  close(): Promise<void>;
}

export interface SqlPoolOptions {
  readonly url: string;
  readonly max: number;
  /** An idle connection that fails (the server restarted) is reported here, never thrown. */
  readonly onError?: (error: Error) => void;
}

/** Timestamps stay strings, as MikroORM's driver hands them back; the domain converts with asDate. */
const types = new pg.TypeOverrides();
for (const oid of [1082, 1114, 1184, 1186]) types.setTypeParser(oid, (text: string) => text);

/** Waiting this long for a free connection means the pool is exhausted: fail, never hang. */
const CONNECT_TIMEOUT_MS = 30_000;

export function createSqlPool(options: SqlPoolOptions): SqlPool {
  const pool = new pg.Pool({
    connectionString: options.url,
    max: options.max,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    idleTimeoutMillis: 30_000,
    types,
  });
  pool.on("error", (error) => options.onError?.(error));
  /**
   * A transaction on one connection. BEGIN is not sent on its own: it goes in front of the
   * transaction's first statement, in the same round trip (see BeginThenQuery). A transaction
   * whose work ran no statement sends nothing at all.
   */
  const inTransaction = (client: pg.PoolClient) => {
    let begun = false;
    const trx: Sql = {
      query(text, bindings, name) {
        if (begun) return run(client, text, bindings, name);
        begun = true;
        return runFirst(client, text, bindings, name);
      },
      transaction: (work) => work(trx),
    };
    return { trx, begun: () => begun };
  };
  return {
    query: (text, bindings, name) => run(pool, text, bindings, name),
    async transaction(work) {
      const client = await pool.connect();
      const { trx, begun } = inTransaction(client);
      let broken: Error | undefined;
      try {
        const result = await work(trx);
        if (begun()) await client.query("COMMIT");
        return result;
      } catch (error) {
        if (begun()) {
          await client.query("ROLLBACK").catch((rollbackFailed: unknown) => {
            broken = rollbackFailed instanceof Error ? rollbackFailed : new Error(String(rollbackFailed));
          });
        }
        throw error;
      } finally {
        // A connection whose rollback failed is in an unknown state: it is closed, not reused.
        client.release(broken);
      }
    },
    close: () => pool.end(),
  };
}

interface Queryable {
  query<T extends pg.QueryResultRow>(config: pg.QueryConfig): Promise<pg.QueryResult<T>>;
}

function checkedValues(bindings: readonly unknown[]): unknown[] {
  return bindings.map((value, i) => {
    if (value === undefined) throw new Error(`undefined SQL binding at position ${i + 1}`);
    return value;
  });
}

async function run<T>(target: Queryable, text: string, bindings: readonly unknown[] = [], name?: string): Promise<T[]> {
  const values = checkedValues(bindings);
  const result = await target.query<T & pg.QueryResultRow>({ text: numbered(text), values, ...(name === undefined ? {} : { name }) });
  return result.rows;
}

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
const PgQuery = pg.Query as unknown as new (config: pg.QueryConfig & { queryMode: "extended"; callback: (error: Error | null, result?: pg.QueryResult) => void }) => pg.Submittable & PgQueryInternals;

/**
 * A transaction's first statement with BEGIN in front of it, in one round trip: BEGIN's Parse,
 * Bind and Execute go ahead of the statement's own messages, under its one Sync. BEGIN's
 * CommandComplete is the only extra reply, and it is dropped here; an error in either aborts the
 * transaction just as it would have after a separate BEGIN, and the caller rolls back. One round
 * trip fewer per transaction is most of a millisecond on an idle machine, where each round trip
 * wakes PostgreSQL and then this process.
 */
class BeginThenQuery extends PgQuery {
  private beginCompleted = false;

  override prepare(connection: WireConnection): void {
    // The unnamed statement and portal: BEGIN is done with both before the statement binds.
    connection.parse({ text: "BEGIN", name: "", types: [] });
    connection.bind({ portal: "", statement: "", values: [] });
    connection.execute({ portal: "", rows: 0 });
    super.prepare(connection);
  }

  override handleCommandComplete(message: unknown, connection: WireConnection): void {
    if (!this.beginCompleted) {
      this.beginCompleted = true;
      return;
    }
    super.handleCommandComplete(message, connection);
  }
}

/** Whether BEGIN may go in front of this statement on this connection (see runFirst). */
function mayPipelineBegin(client: pg.PoolClient, text: string, name: string | undefined): boolean {
  if (name === undefined) return true;
  const connection = (client as unknown as { connection?: WireConnection }).connection;
  return connection?.parsedStatements[name] === text;
}

/**
 * A transaction's first statement, BEGIN sent with it. pg records a named statement as parsed
 * on the first ParseComplete its query sees, which here would be BEGIN's: so a named statement
 * not yet prepared on this connection (its first use per connection) gets BEGIN on its own first.
 */
async function runFirst<T>(client: pg.PoolClient, text: string, bindings: readonly unknown[] = [], name?: string): Promise<T[]> {
  const values = checkedValues(bindings);
  const statement = numbered(text);
  if (!mayPipelineBegin(client, statement, name)) {
    await client.query("BEGIN");
    return run(client, text, values, name);
  }
  const result = await new Promise<pg.QueryResult>((resolve, reject) => {
    client.query(
      new BeginThenQuery({
        text: statement,
        values,
        ...(name === undefined ? {} : { name }),
        queryMode: "extended",
        callback: (error, done) => (error ? reject(error) : resolve(done!)),
      }),
    );
  });
  return result.rows as T[];
}

const numberedTexts = new Map<string, string>();

/** `?` placeholders as PostgreSQL's `$1, $2, …`, converted once per distinct statement. */
function numbered(text: string): string {
  let converted = numberedTexts.get(text);
  if (converted === undefined) {
    let n = 0;
    converted = text.replace(/\?/g, () => `$${++n}`);
    if (numberedTexts.size < 10_000) numberedTexts.set(text, converted);
  }
  return converted;
}

export async function rows<T>(sql: Sql, query: string, bindings: readonly unknown[] = []): Promise<T[]> {
  return sql.query<T>(query, bindings);
}

/** MikroORM's pg driver hands timestamps back as strings; the domain speaks Date. */
export function asDate(value: unknown): Date {
  return value instanceof Date ? value : new Date(String(value));
}

export function optionalDate(value: unknown): Date | undefined {
  return value === null || value === undefined ? undefined : asDate(value);
}

export const optional = <T>(value: T | null | undefined): T | undefined => (value === null ? undefined : value);

/** Page tokens are opaque to clients: base64url of the last row's sort key. */
export function encodePageToken(key: string): string {
  return Buffer.from(key, "utf8").toString("base64url");
}

export function decodePageToken(token: string): string | undefined {
  if (token === "") return undefined;
  return Buffer.from(token, "base64url").toString("utf8");
}

const statementNames = new Map<string, string>();

/**
 * Like rows(), as a named prepared statement: PostgreSQL parses and plans it once per
 * connection instead of on every call. The big CTE statements on the hot paths (admitting a
 * message, claiming a run, committing a step) cost more to plan than to run. Only for SQL text
 * from a bounded set: every distinct text becomes one statement on every pooled connection.
 */
export async function preparedRows<T>(sql: Sql, query: string, bindings: readonly unknown[] = []): Promise<T[]> {
  let name = statementNames.get(query);
  if (name === undefined) {
    name = `keel_${createHash("sha1").update(query).digest("hex").slice(0, 24)}`;
    statementNames.set(query, name);
  }
  return sql.query<T>(query, bindings, name);
}
