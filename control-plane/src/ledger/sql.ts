import { createHash } from "node:crypto";
import type { Knex } from "@mikro-orm/postgresql";
import type { LedgerOrm } from "./orm.js";

export type Sql = Knex;
export type SqlTransaction = Knex.Transaction;

/**
 * The query builder on MikroORM's own connection pool. Hot paths (claiming, committing
 * a step, streaming emissions) are hand-written SQL because they lean on row locks,
 * SKIP LOCKED and NOTIFY; entities define the schema and its migrations.
 */
export function sqlOf(orm: LedgerOrm): Sql {
  return orm.em.getConnection().getKnex();
}

export async function rows<T>(sql: Sql | SqlTransaction, query: string, bindings: readonly unknown[] = []): Promise<T[]> {
  const result = (await sql.raw(query, bindings as Knex.RawBinding[])) as { rows: T[] };
  return result.rows;
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
 * message, claiming a run) cost more to plan than to run. Only for constant SQL text: every
 * distinct text becomes one statement on every pooled connection.
 */
export async function preparedRows<T>(sql: Sql | SqlTransaction, query: string, bindings: readonly unknown[] = []): Promise<T[]> {
  let name = statementNames.get(query);
  if (name === undefined) {
    name = `keel_${createHash("sha1").update(query).digest("hex").slice(0, 24)}`;
    statementNames.set(query, name);
  }
  const result = (await sql.raw(query, bindings as Knex.RawBinding[]).options({ name })) as { rows: T[] };
  return result.rows;
}
