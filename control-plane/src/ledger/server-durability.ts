// What the database server's own settings do to durability, read once when the ledger opens.
// KEEL_DURABILITY says which commits wait for their WAL flush; a server whose synchronous_commit
// is off would quietly make every other commit skip that wait. So Keel's sessions start with the
// server's setting pinned, off raised to on, and a commit that may skip its flush says so itself.
import pg from "pg";
import { fragment } from "./sql.js";

export interface ServerSettings {
  readonly fsync: string;
  readonly synchronousCommit: string;
}

export interface SessionDurability {
  /** Settings every session of Keel's pools starts with (SqlPoolOptions.sessionSettings). */
  readonly sessionSettings: Readonly<Record<string, string>>;
  /** What the operator should hear about, at most one line each. */
  readonly notices: readonly { readonly level: "info" | "warn"; readonly message: string }[];
}

/**
 * The settings Keel's sessions start with, given the server's. synchronous_commit is pinned at
 * start-up, so a later reload of the server's configuration cannot lower it under a running Keel:
 * off becomes on, and any other value (local, remote_write, on, remote_apply: each waits at least
 * for the local flush) is kept, so an operator's choice about standbys is respected. fsync off
 * cannot be mended from a session: it is said once, loudly.
 */
export function sessionDurability(server: ServerSettings): SessionDurability {
  const notices: { level: "info" | "warn"; message: string }[] = [];
  const synchronousCommit = server.synchronousCommit === "off" ? "on" : server.synchronousCommit;
  if (server.synchronousCommit === "off") {
    notices.push({ level: "info", message: "PostgreSQL's synchronous_commit is off for this database; Keel's connections turn it on, so commits wait for the WAL as KEEL_DURABILITY says" });
  }
  if (server.fsync !== "on") {
    notices.push({ level: "warn", message: "PostgreSQL runs with fsync off: a crash of the machine can lose committed runs, whatever KEEL_DURABILITY says" });
  }
  return { sessionSettings: { synchronous_commit: synchronousCommit }, notices };
}

/** The server's settings as a session of `url` sees them (database and role settings included). */
export async function readServerSettings(url: string): Promise<ServerSettings> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ fsync: string; synchronous_commit: string }>(
      "SELECT current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS synchronous_commit",
    );
    const row = rows[0];
    if (row === undefined) throw new Error("PostgreSQL did not report its settings");
    return { fsync: row.fsync, synchronousCommit: row.synchronous_commit };
  } finally {
    await client.end();
  }
}

/**
 * The CTE `durability` of a statement whose transaction may skip its WAL flush: "off" skips it;
 * "on" keeps the session's setting, which waits (pinned above), so a stronger one the operator
 * chose (remote_apply) is not lowered either.
 */
export function durabilityCte<P>(synchronousCommit: (params: P) => "on" | "off") {
  return fragment<P>`durability AS (SELECT CASE WHEN ${synchronousCommit}::text = 'off' THEN set_config('synchronous_commit', 'off', true) END AS setting)`;
}
