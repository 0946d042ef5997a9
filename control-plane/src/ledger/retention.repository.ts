// Retention: finished runs older than a cutoff are deleted with every row that belongs to them,
// a bounded batch per transaction, so the ledger stops growing without bound (issue #12).
import { LIVE_SQL } from "./run-start.sql.js";
import { fragment, raw, statement, type Sql, type Statement, type StatementFragment } from "./sql.js";

/** What a sweep removed (or, dry, would remove), per table. */
export type RetentionCounts = Record<RetentionTable, number>;

export type RetentionTable =
  | "runs"
  | "run_steps"
  | "model_calls"
  | "tool_invocations"
  | "observations"
  | "artifacts"
  | "run_events"
  | "run_triggers"
  | "emissions"
  | "progress_events"
  | "messages"
  | "workspaces";

export interface RetentionSweepOptions {
  /** Runs that finished before this are deleted. */
  readonly finishedBefore: Date;
  /** Runs per transaction; each batch holds its locks only while it deletes. */
  readonly batchSize?: number;
  /** Every batch is deleted and then rolled back, so the counts are exact and nothing changes. */
  readonly dryRun?: boolean;
  readonly signal?: AbortSignal;
}

export interface RetentionRepository {
  sweep(options: RetentionSweepOptions): Promise<RetentionCounts>;
}

const DEFAULT_BATCH_SIZE = 200;

type Ids = { readonly ids: readonly string[] };
const ids = (p: Ids) => p.ids;

/**
 * Old finished runs in (finished_at, id) order after a cursor, so one sweep passes each candidate
 * once even when some stay (below). The cursor is the timestamp's text: a Date would drop its
 * microseconds and find the same run again. Locked, so a concurrent sweep takes other runs.
 */
const afterAt = (p: { readonly afterAt: string | null }) => p.afterAt;
const candidates = statement<{ cutoff: Date; afterAt: string | null; afterId: string | null; limit: number }, { id: string; finished_key: string }>(
  "retention_candidates",
)`
  SELECT r.id, r.finished_at::text AS finished_key FROM runs r
  WHERE r.finished_at IS NOT NULL AND r.finished_at < ${(p) => p.cutoff} AND r.status NOT IN (${raw(LIVE_SQL)})
    AND (${afterAt}::timestamptz IS NULL OR r.finished_at > ${afterAt}::timestamptz
         OR (r.finished_at = ${afterAt}::timestamptz AND r.id > ${(p) => p.afterId}::uuid))
  ORDER BY r.finished_at, r.id LIMIT ${(p) => p.limit}
  FOR NO KEY UPDATE OF r SKIP LOCKED`;

const referencedOutside = (column: string) => `EXISTS (SELECT 1 FROM runs h WHERE h.${column} = b.id AND h.id <> ALL(b.batch))`;

/**
 * Runs of the batch that must stay because something outside the batch still points at them: a
 * run that inherits from, continues, supersedes or descends from them (a live one included), a
 * message of theirs that another run was triggered by or another message edits, a workspace still
 * held, or a work graph. The caller drops these and asks again until none is left.
 */
const pinned = statement<Ids, { id: string }>("retention_pinned")`
  SELECT b.id FROM (SELECT unnest(${ids}::uuid[]) AS id, ${ids}::uuid[] AS batch) b
  WHERE ${raw(
    ["parent_run_id", "root_run_id", "superseded_by_run_id", "continuation_of_run_id", "logical_request_id", "inherits_from_run_id"]
      .map(referencedOutside)
      .join("\n    OR "),
  )}
    OR EXISTS (SELECT 1 FROM messages m JOIN run_triggers t ON t.message_id = m.id WHERE m.run_id = b.id AND t.run_id <> ALL(b.batch))
    OR EXISTS (SELECT 1 FROM messages m JOIN messages e ON e.edit_of_message_id = m.id
               WHERE m.run_id = b.id AND e.run_id IS NOT NULL AND e.run_id <> ALL(b.batch))
    OR EXISTS (SELECT 1 FROM workspaces w WHERE w.run_id = b.id AND w.status = 'active')
    OR EXISTS (SELECT 1 FROM work_graphs g WHERE g.root_run_id = b.id)
    OR EXISTS (SELECT 1 FROM work_node_attempts a WHERE a.child_run_id = b.id)`;

const counted = (name: RetentionTable, deletion: StatementFragment<Ids>) =>
  statement<Ids, { n: number }>(`retention_delete_${name}`)`
    WITH gone AS (${deletion} RETURNING 1) SELECT count(*)::int AS n FROM gone`;

/** In dependency order: every row is deleted before the rows it references. */
const deletions: readonly (readonly [RetentionTable, Statement<Ids, { n: number }>])[] = [
  [
    "progress_events",
    counted(
      "progress_events",
      fragment`DELETE FROM progress_events WHERE run_id = ANY(${ids}::uuid[]) OR emission_id IN (SELECT id FROM emissions WHERE run_id = ANY(${ids}::uuid[]))`,
    ),
  ],
  ["emissions", counted("emissions", fragment`DELETE FROM emissions WHERE run_id = ANY(${ids}::uuid[])`)],
  ["run_events", counted("run_events", fragment`DELETE FROM run_events WHERE run_id = ANY(${ids}::uuid[])`)],
  ["observations", counted("observations", fragment`DELETE FROM observations WHERE run_id = ANY(${ids}::uuid[])`)],
  ["artifacts", counted("artifacts", fragment`DELETE FROM artifacts WHERE run_id = ANY(${ids}::uuid[])`)],
  ["tool_invocations", counted("tool_invocations", fragment`DELETE FROM tool_invocations WHERE run_id = ANY(${ids}::uuid[])`)],
  // A step's call goes with its step's row (below); it is counted here, with the calls beside the loop.
  [
    "model_calls",
    statement<Ids, { n: number }>("retention_delete_model_calls")`
      WITH gone AS (DELETE FROM side_model_calls WHERE run_id = ANY(${ids}::uuid[]) RETURNING 1)
      SELECT ((SELECT count(*) FROM gone) + (SELECT count(*) FROM run_steps WHERE run_id = ANY(${ids}::uuid[]) AND call_id IS NOT NULL))::int AS n`,
  ],
  ["run_steps", counted("run_steps", fragment`DELETE FROM run_steps WHERE run_id = ANY(${ids}::uuid[])`)],
  ["workspaces", counted("workspaces", fragment`DELETE FROM workspaces WHERE run_id = ANY(${ids}::uuid[])`)],
  ["run_triggers", counted("run_triggers", fragment`DELETE FROM run_triggers WHERE run_id = ANY(${ids}::uuid[])`)],
  // An edit that names no run of its own goes with the message it revises.
  [
    "messages",
    counted(
      "messages",
      fragment`DELETE FROM messages m WHERE m.run_id = ANY(${ids}::uuid[])
       OR (m.run_id IS NULL AND m.edit_of_message_id IN (SELECT o.id FROM messages o WHERE o.run_id = ANY(${ids}::uuid[]))
           AND NOT EXISTS (SELECT 1 FROM run_triggers t WHERE t.message_id = m.id))`,
    ),
  ],
  ["runs", counted("runs", fragment`DELETE FROM runs WHERE id = ANY(${ids}::uuid[])`)],
];

const zero = (): RetentionCounts => ({
  runs: 0,
  run_steps: 0,
  model_calls: 0,
  tool_invocations: 0,
  observations: 0,
  artifacts: 0,
  run_events: 0,
  run_triggers: 0,
  emissions: 0,
  progress_events: 0,
  messages: 0,
  workspaces: 0,
});

export function createRetentionRepository(sql: Sql): RetentionRepository {
  return {
    async sweep(options) {
      const limit = options.batchSize ?? DEFAULT_BATCH_SIZE;
      const total = zero();
      let after: { at: string; id: string } | undefined;
      for (;;) {
        options.signal?.throwIfAborted();
        // A dry run's batch is deleted and rolled back, which keeps its counts exact.
        const batch = await sql.transaction(
          async (trx) => {
            const found = await trx.run(candidates, {
              cutoff: options.finishedBefore,
              afterAt: after?.at ?? null,
              afterId: after?.id ?? null,
              limit,
            });
            const last = found.at(-1);
            if (last === undefined) return undefined;
            after = { at: last.finished_key, id: last.id };
            return deleteBatch(trx, found.map((r) => r.id));
          },
          () => options.dryRun !== true,
        );
        if (batch === undefined) return total;
        for (const key of Object.keys(total) as RetentionTable[]) total[key] += batch[key];
      }
    },
  };
}

async function deleteBatch(trx: Sql, found: readonly string[]): Promise<RetentionCounts> {
  const counts = zero();
  let batch = [...found];
  // Dropping a pinned run can pin another (it pointed at it), so ask until the batch is stable.
  for (;;) {
    if (batch.length === 0) return counts;
    const stay = new Set((await trx.run(pinned, { ids: batch })).map((r) => r.id));
    if (stay.size === 0) break;
    batch = batch.filter((id) => !stay.has(id));
  }
  for (const [table, stmt] of deletions) {
    const [row] = await trx.run(stmt, { ids: batch });
    counts[table] = row?.n ?? 0;
  }
  return counts;
}
