import pg from "pg";
import { performance } from "node:perf_hooks";
import { NOTIFY_SPACING_MS, type Channel } from "./notification-hub.js";
import { pipeline } from "./pg-pipelined-begin.js";
import { SqlQuery, statement, type Statement } from "./sql-text.js";

export { fragment, raw, registeredStatements, sql, statement, SqlQuery, type Statement, type StatementFragment, type StatementPart } from "./sql-text.js";

/**
 * Keel's own SQL access: a plain `pg` pool, no query builder. The hot paths (claiming,
 * committing a step, admitting a message, streaming emissions) lean on row locks, SKIP LOCKED
 * and NOTIFY, and a query builder's pool cost more CPU per statement than PostgreSQL spent
 * running it. MikroORM owns the schema (entities, migrations).
 */
export interface Sql {
  /**
   * A fixed statement, as a named prepared statement (parsed once per connection). Outside a
   * transaction, one declared with plans "generic" runs on the generic-plan connections.
   */
  run<P, R>(statement: Statement<P, R>, params: P): Promise<R[]>;
  /**
   * Two fixed statements in one round trip inside a transaction (where pg allows; one after the
   * other outside one). The second still runs after the first has finished, on a snapshot of its
   * own, so it sees what committed while the first waited on a lock.
   */
  runBoth<P1, R1, P2, R2>(first: Statement<P1, R1>, firstParams: P1, second: Statement<P2, R2>, secondParams: P2): Promise<[R1[], R2[]]>;
  /** An ad-hoc statement built with sql``. */
  query<T = Record<string, unknown>>(query: SqlQuery): Promise<T[]>;
  /**
   * A transaction's last statement, sent with its COMMIT in one round trip: when it returns, the
   * transaction is committed (and nothing more may run in it); when it fails, nothing was. Only
   * for work whose result is kept. Outside a transaction, the same as run.
   */
  runLast<P, R>(statement: Statement<P, R>, params: P): Promise<R[]>;
  /**
   * runLast for several: the statement once for each params, in order, then COMMIT, all in one
   * round trip (group commit: one transaction, one WAL flush). One that fails fails them all and
   * nothing is committed. Outside a transaction, each is a statement on its own.
   */
  runEachLast<P, R>(statement: Statement<P, R>, params: readonly P[]): Promise<R[][]>;
  /**
   * BEGIN … COMMIT on one connection; ROLLBACK when `work` throws, or when `keep` says its result
   * is not to be kept (an attempt that must be tried again). Inside a transaction, runs `work` in
   * it (with the outer transaction's options).
   */
  transaction<T>(work: (trx: SqlTransaction) => Promise<T>, keep?: (result: T) => boolean, options?: TransactionOptions): Promise<T>;
  /**
   * Wakes LISTENers on `channel` once what was written is committed: at once outside a
   * transaction, after its COMMIT inside one, never after a rollback. Not from inside the
   * transaction: one that NOTIFYs holds PostgreSQL's cluster-wide notify lock from before its
   * commit until after it, WAL flush included, so synchronous commits that notify flush one at a
   * time instead of together. Sent afterwards from a statement that writes no WAL, the lock is
   * held for an instant. A wake-up lost to a crash in between costs a listener its poll interval.
   */
  notify(channel: Channel, payload: string): void;
}

export interface TransactionOptions {
  /**
   * "generic": every statement uses its connection's one cached generic plan (plan_cache_mode
   * force_generic_plan), never a custom plan per execution. For a hot transaction of complex
   * statements that PostgreSQL would otherwise plan on every call (planning then costs more than
   * running them); only for statements whose generic plan is known to be good
   * (test/ledger-statements.test.ts checks admission's). Sequential scans are ruled out
   * (GENERIC_PLANS): these statements find their rows by key. They run on connections opened
   * with these settings, kept apart from the rest.
   */
  readonly plans?: "generic";
  /**
   * Fail with lock_not_available (55P03) instead of waiting longer than this for a row lock: for
   * a transaction that would rather be retried in smaller parts than wait, or deadlock, with another.
   */
  readonly lockTimeoutMs?: number;
}

/**
 * A connection makes a generic plan once and keeps it until the table is next analyzed, which
 * autovacuum does a minute or more after it changes. Planned on a new install's empty tables, a
 * statement chose sequential scans and kept them as the tables grew (a step commit read every
 * tool call ever made). The statements run this way find every row by key, so the plan is made
 * with sequential scans ruled out wherever an index serves.
 */
const GENERIC_PLANS = { plan_cache_mode: "force_generic_plan", enable_seqscan: "off" } as const;

/**
 * The same settings as a connection's startup options: the connections that serve generic-plan
 * transactions are opened with them, so those transactions send no SET LOCAL (two statements
 * fewer on every step commit, claim and admission).
 */
export const GENERIC_PLAN_OPTIONS = startupOptions(GENERIC_PLANS);

/** A connection URL without its `options` parameter, and that parameter (empty when it has none). */
function withoutStartupOptions(connectionString: string): { url: string; urlOptions: string } {
  let parsed: URL;
  try {
    parsed = new URL(connectionString);
  } catch {
    return { url: connectionString, urlOptions: "" };
  }
  const urlOptions = parsed.searchParams.get("options");
  if (urlOptions === null) return { url: connectionString, urlOptions: "" };
  parsed.searchParams.delete("options");
  return { url: parsed.toString(), urlOptions };
}

/** Settings as a connection's startup options (`-c name=value …`). */
function startupOptions(settings: Readonly<Record<string, string>>): string {
  return Object.entries(settings)
    .map(([name, value]) => `-c ${name}=${value}`)
    .join(" ");
}

function openingOf(options: TransactionOptions | undefined): string[] {
  const opening = ["BEGIN"];
  const lockTimeout = options?.lockTimeoutMs;
  if (lockTimeout !== undefined) {
    if (!Number.isSafeInteger(lockTimeout) || lockTimeout < 1) throw new Error(`lockTimeoutMs must be a positive whole number, not ${lockTimeout}`);
    opening.push(`SET LOCAL lock_timeout = ${lockTimeout}`);
  }
  return opening;
}

/** The same interface, bound to one connection inside BEGIN … COMMIT. */
export type SqlTransaction = Sql;

export interface SqlPool extends Sql {
  close(): Promise<void>;
}

export interface SqlPoolOptions {
  readonly url: string;
  /**
   * Connections at most for generic-plan transactions (admission, claims, step commits), and as
   * many again for everything else: the hot paths never queue behind reads, nor reads behind them.
   */
  readonly max: number;
  /** An idle connection that fails (the server restarted) is reported here, never thrown. */
  readonly onError?: (error: Error) => void;
  /** Settings every connection starts with (server-durability.ts pins synchronous_commit this way). */
  readonly sessionSettings?: Readonly<Record<string, string>>;
}

/** Timestamps arrive as Date (pg's default); intervals and dates stay text. */
const types = new pg.TypeOverrides();
for (const oid of [1082, 1186]) types.setTypeParser(oid, (text: string) => text);

/** Waiting this long for a free connection means the pool is exhausted: fail, never hang. */
const CONNECT_TIMEOUT_MS = 30_000;

/** Sends a statement; `plans` is the statement's plan mode (only the pool acts on it: a transaction's connection is fixed). */
type Send = (config: pg.QueryConfig, plans?: "generic") => Promise<pg.QueryResult>;

export function createSqlPool(options: SqlPoolOptions): SqlPool {
  let closing = false;
  // pg hands the failed client along with the error; it is not worth logging, and once the pool
  // is closing a server that ends its connections first is expected.
  const onPoolError = (error: Error & { client?: unknown }) => {
    if (closing) return;
    const { message, code } = error as Error & { code?: string };
    options.onError?.(Object.assign(new Error(message), code === undefined ? {} : { code }));
  };
  // A fixed-size pool: a connection opened under load stays open, so the next burst pays
  // neither for connecting nor for planning its statements again (they are planned once per
  // connection). Only a connection that fails is replaced; none is closed for being idle.
  // A URL's own startup options would replace these (pg lets the URL win): they go first, these
  // after them, and PostgreSQL takes the last value a setting is given.
  const { url, urlOptions } = withoutStartupOptions(options.url);
  const fixedPool = (max: number, settings: Readonly<Record<string, string>>): pg.Pool => {
    const startup = [urlOptions, startupOptions(settings)].filter((part) => part !== "").join(" ");
    const config = { connectionString: url, max, min: max, connectionTimeoutMillis: CONNECT_TIMEOUT_MS, types };
    const opened = new pg.Pool(startup === "" ? config : { ...config, options: startup });
    opened.on("error", onPoolError);
    return opened;
  };
  const session = options.sessionSettings ?? {};
  const pool = fixedPool(options.max, session);
  const genericPool = fixedPool(options.max, { ...GENERIC_PLANS, ...session });
  const notifyAll = notifier((config) => pool.query(config));
  const pooled = over((config, plans) => (plans === "generic" ? genericPool : pool).query(config));
  return {
    ...pooled,
    runLast: pooled.run,
    async runEachLast(statement, params) {
      const results = [];
      for (const one of params) results.push(await pooled.run(statement, one));
      return results;
    },
    notify: (channel, payload) => notifyAll([[channel, payload]]),
    async transaction(work, keep, options) {
      const opening = openingOf(options);
      const client = await (options?.plans === "generic" ? genericPool : pool).connect();
      // A checked-out client has no pool listener: a connection the server ends between two
      // statements (a restart) would emit an unhandled 'error' and end the process. The next
      // statement fails instead, and the client is closed, not reused.
      let lost: Error | undefined;
      const onLost = (error: Error) => {
        lost = error;
      };
      client.on("error", onLost);
      // BEGIN goes out with the first statement (pg-pipelined-begin.ts); no statement, nothing sent.
      let begun = false;
      // Committed with its last statement (runLast): nothing more runs in it, nor a ROLLBACK.
      let committed = false;
      const notCommitted = (): void => {
        if (committed) throw new Error("this transaction committed with its last statement: nothing more may run in it");
      };
      const notices: Notice[] = [];
      const opened = (): readonly string[] => {
        if (begun) return [];
        begun = true;
        return opening;
      };
      const runEachLast = async <P, R>(statement: Statement<P, R>, params: readonly P[]): Promise<R[][]> => {
        notCommitted();
        if (params.length === 0) return [];
        // A transaction of one statement and no settings needs no BEGIN or COMMIT: PostgreSQL runs
        // a statement outside a block as a transaction of its own, committed (or rolled back,
        // deferred checks included) before it answers. Two statements fewer on a lone step commit.
        const results =
          !begun && params.length === 1 && opening.length === 1
            ? [await client.query(prepared(statement, params[0]!))]
            : await pipeline(client, params.map((one) => prepared(statement, one)), opened(), ["COMMIT"]);
        committed = true;
        return results.map((result) => result.rows as R[]);
      };
      const trx: Sql = {
        ...over(async (config) => {
          notCommitted();
          return begun ? client.query(config) : (await pipeline(client, [config], opened()))[0]!;
        }),
        async runBoth(first, firstParams, second, secondParams) {
          notCommitted();
          const [one, two] = await pipeline(client, [prepared(first, firstParams), prepared(second, secondParams)], opened());
          return [one!.rows, two!.rows];
        },
        runLast: async (statement, params) => (await runEachLast(statement, [params]))[0]!,
        runEachLast,
        transaction: (inner) => inner(trx),
        notify: (channel, payload) => void notices.push([channel, payload]),
      };
      let broken: Error | undefined;
      try {
        const result = await work(trx);
        const kept = keep === undefined || keep(result);
        if (committed && !kept) throw new Error("a transaction committed with its last statement cannot be rolled back");
        if (begun && !committed) await client.query(kept ? "COMMIT" : "ROLLBACK");
        if (kept) notifyAll(notices);
        return result;
      } catch (error) {
        // What committed wakes its listeners whatever failed after it.
        if (committed) notifyAll(notices);
        else if (begun) {
          await client.query("ROLLBACK").catch((rollbackFailed: unknown) => {
            broken = rollbackFailed instanceof Error ? rollbackFailed : new Error(String(rollbackFailed));
          });
        }
        throw error;
      } finally {
        // A connection whose rollback failed is in an unknown state: it is closed, not reused.
        client.off("error", onLost);
        client.release(broken ?? lost);
      }
    },
    close: async () => {
      closing = true;
      await Promise.all([pool.end(), genericPool.end()]);
    },
  };
}

type Notice = readonly [Channel, string];

/**
 * A transaction that notifies is given a transaction id, so its commit writes a commit record and
 * would wait for its WAL flush, holding PostgreSQL's one notification lock meanwhile. What it
 * announces committed before it, and a lost notice is covered by the listeners' polling: it
 * commits without waiting.
 */
const notifyStatement = statement<{ channels: string[]; payloads: string[] }>("ledger_notify")`
  SELECT pg_notify(n.channel, n.payload)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS durability,
    unnest(${(p) => p.channels}::text[], ${(p) => p.payloads}::text[]) AS n(channel, payload)`;

/**
 * Sends committed transactions' notifications: one statement at a time, and whatever arrives
 * while one is out goes (once per channel and payload) in the next, so a busy process pays far
 * fewer statements than commits. A spaced channel (NOTIFY_SPACING_MS) sent within its spacing
 * waits for the next send after it. A failed send is dropped: listeners poll as a safety net.
 */
function notifier(send: Send, spacingMs: Readonly<Partial<Record<Channel, number>>> = NOTIFY_SPACING_MS): (notices: readonly Notice[]) => void {
  let pending = new Map<string, Notice>();
  const lastSent = new Map<Channel, number>();
  let sending = false;
  let timer: NodeJS.Timeout | undefined;
  const dueAt = (channel: Channel) => (lastSent.get(channel) ?? -Infinity) + (spacingMs[channel] ?? 0);
  /** Takes what is due now out of pending; returns it and when the rest falls due. */
  const takeDue = (now: number): { batch: Notice[]; next: number } => {
    const batch: Notice[] = [];
    let next = Infinity;
    const waiting = new Map<string, Notice>();
    for (const [key, notice] of pending) {
      const due = dueAt(notice[0]);
      if (due <= now) batch.push(notice);
      else {
        waiting.set(key, notice);
        next = Math.min(next, due);
      }
    }
    pending = waiting;
    return { batch, next };
  };
  const drain = async (): Promise<void> => {
    for (;;) {
      const now = performance.now();
      const { batch, next } = takeDue(now);
      if (batch.length === 0) {
        sending = false;
        if (next !== Infinity) timer ??= setTimeout(() => ((timer = undefined), start()), next - now).unref();
        return;
      }
      for (const [channel] of batch) if (spacingMs[channel] !== undefined) lastSent.set(channel, now);
      const params = { channels: batch.map(([channel]) => channel), payloads: batch.map(([, payload]) => payload) };
      await send({ name: notifyStatement.name, text: notifyStatement.text, values: notifyStatement.bind(params) }).catch(() => undefined);
    }
  };
  const start = () => {
    if (sending || pending.size === 0) return;
    sending = true;
    void drain();
  };
  return (notices) => {
    for (const notice of notices) pending.set(`${notice[0]}\n${notice[1]}`, notice);
    start();
  };
}

function prepared<P>(statement: Statement<P, unknown>, params: P): pg.QueryConfig {
  return { name: statement.name, text: statement.text, values: statement.bind(params) };
}

/** run, runBoth and query over one way of sending a statement (the pool, or a transaction's connection). */
function over(send: Send): Pick<Sql, "run" | "runBoth" | "query"> {
  const run = async <P, R>(statement: Statement<P, R>, params: P): Promise<R[]> => (await send(prepared(statement, params), statement.plans)).rows as R[];
  return {
    run,
    async runBoth(first, firstParams, second, secondParams) {
      return [await run(first, firstParams), await run(second, secondParams)];
    },
    async query<T>(query: SqlQuery) {
      const result = await send({ text: query.text, values: checkedValues(query.values) });
      return result.rows as T[];
    },
  };
}

function checkedValues(bindings: readonly unknown[]): unknown[] {
  return bindings.map((value, i) => {
    if (value === undefined) throw new Error(`undefined SQL binding at position ${i + 1}`);
    return value;
  });
}

/** The domain speaks Date; a value read as text (an aggregate, a JSON field) is parsed. */
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
