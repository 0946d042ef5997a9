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
  const onClient = (client: pg.ClientBase): Sql => ({
    query: (text, bindings, name) => run(client, text, bindings, name),
    transaction: (work) => work(onClient(client)),
  });
  return {
    query: (text, bindings, name) => run(pool, text, bindings, name),
    async transaction(work) {
      const client = await pool.connect();
      let broken: Error | undefined;
      try {
        await client.query("BEGIN");
        const result = await work(onClient(client));
        await client.query("COMMIT");
        return result;
      } catch (error) {
        await client.query("ROLLBACK").catch((rollbackFailed: unknown) => {
          broken = rollbackFailed instanceof Error ? rollbackFailed : new Error(String(rollbackFailed));
        });
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

async function run<T>(target: Queryable, text: string, bindings: readonly unknown[] = [], name?: string): Promise<T[]> {
  const values = bindings.map((value, i) => {
    if (value === undefined) throw new Error(`undefined SQL binding at position ${i + 1}`);
    return value;
  });
  const result = await target.query<T & pg.QueryResultRow>({ text: numbered(text), values, ...(name === undefined ? {} : { name }) });
  return result.rows;
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
