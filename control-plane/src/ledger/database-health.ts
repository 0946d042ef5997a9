import { statement, type Sql } from "./sql.js";

const ping = statement<Record<string, never>, { answered: number }>("database_ping")`SELECT 1 AS answered`;

/** Whether the database answers a trivial query within `timeoutMs`; never throws. */
export async function databaseAnswers(db: Sql, timeoutMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
  try {
    return await Promise.race([db.run(ping, {}).then((rows) => rows[0]?.answered === 1), late]);
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}
