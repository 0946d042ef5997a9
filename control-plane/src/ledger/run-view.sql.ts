// A run as operators see it: its columns, why it waits and its place in the queue, worked out
// from the ledger as it is when read, so a wait reason is never stale. The wait reason is the
// run-start rule of domain/run-start.ts as rendered in run-start.sql.ts, not a copy of it.
import type { RunStatus } from "../domain/run.js";
import { AHEAD_SQL, startBlockerSql } from "./run-start.sql.js";
import { RUN_COLUMNS, type RunRow } from "./rows/ledger-rows.js";
import { fragment, raw, statement } from "./sql.js";

/** The start rule's input: the clock coalescing is judged on (the install's ceiling is read from the ledger). */
export interface RunViewParams {
  readonly now: Date;
}
const now = (p: RunViewParams) => p.now;

/** A queued run's reason is what blocks it now (or the stored one when nothing does); any other run's is stored. */
const WAIT_REASON = fragment<RunViewParams>`CASE WHEN r.status <> 'queued' THEN r.wait_reason
    ELSE coalesce(${startBlockerSql<RunViewParams>({ now })}, r.wait_reason) END`;

/**
 * A queued run's position, from 1: in its conversation's queue when that is what holds it,
 * else among its agent's queued root runs by creation; 0 for a run not waiting in a queue.
 */
const QUEUE_POSITION = `CASE WHEN r.status <> 'queued' OR r.paused THEN 0
    WHEN waiting.reason = 'conversation_busy' THEN 1 + (
      SELECT count(*) FROM runs o WHERE o.conversation_id = r.conversation_id AND o.parent_run_id IS NULL AND o.status = 'queued'
        AND o.started_at IS NULL AND ${AHEAD_SQL})
    ELSE 1 + (
      SELECT count(*) FROM runs o WHERE o.agent_id = r.agent_id AND o.parent_run_id IS NULL AND o.status = 'queued' AND NOT o.paused
        AND (o.created_at, o.id) < (r.created_at, r.id)) END::int`;

const RUN_VIEW_COLUMNS = raw(`${RUN_COLUMNS("r")}, c.external_id AS external_conversation_id,
    waiting.reason AS effective_wait_reason, ${QUEUE_POSITION} AS queue_position,
    r.forked_from_run_id, r.forked_at_step, r.fork_reason,
    ARRAY(SELECT f.id::text FROM runs f WHERE f.forked_from_run_id = r.id ORDER BY f.created_at, f.id) AS fork_run_ids`);

const RUN_VIEW_FROM = fragment<RunViewParams>`runs r JOIN conversations c ON c.id = r.conversation_id JOIN agents a ON a.id = r.agent_id
    CROSS JOIN LATERAL (SELECT ${WAIT_REASON} AS reason) waiting`;

export const selectRun = statement<RunViewParams & { readonly runId: string }, RunRow>("run_query_get_run")`
  SELECT ${RUN_VIEW_COLUMNS} FROM ${RUN_VIEW_FROM} WHERE r.id = ${(p) => p.runId}::uuid`;

export interface ListRunsParams extends RunViewParams {
  readonly agentId: string | null;
  readonly externalConversationId: string | null;
  readonly status: RunStatus | null;
  /** The last row of the previous page (see RunsPageKey), or null for the first page. */
  readonly afterCreatedAt: string | null;
  readonly afterId: string | null;
  readonly limit: number;
}
const agentId = (p: ListRunsParams) => p.agentId;
const externalConversationId = (p: ListRunsParams) => p.externalConversationId;
const status = (p: ListRunsParams) => p.status;
const afterCreatedAt = (p: ListRunsParams) => p.afterCreatedAt;
const afterId = (p: ListRunsParams) => p.afterId;

/**
 * The sort key to the microsecond, as PostgreSQL stores it: a JS Date keeps milliseconds, and
 * a key cut to them would repeat or skip runs created in the same millisecond across pages.
 */
const PAGE_KEY_SQL = `to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`;

/** Newest first; a filter left null matches every run (one prepared statement serves every combination). */
export const listRunsPage = statement<ListRunsParams, RunRow & { page_key: string }>("run_query_list_runs")`
  SELECT ${RUN_VIEW_COLUMNS}, ${raw(PAGE_KEY_SQL)} AS page_key FROM ${RUN_VIEW_FROM}
  WHERE (${agentId}::text IS NULL OR r.agent_id = ${agentId})
    AND (${externalConversationId}::text IS NULL OR c.external_id = ${externalConversationId})
    AND (${status}::text IS NULL OR r.status = ${status})
    AND (${afterCreatedAt}::timestamptz IS NULL OR (r.created_at, r.id) < (${afterCreatedAt}::timestamptz, ${afterId}::uuid))
  ORDER BY r.created_at DESC, r.id DESC
  LIMIT ${(p) => p.limit}`;

/** Where a ListRuns page ends: the last run's creation time to the microsecond (UTC) and its id. */
export interface RunsPageKey {
  readonly createdAt: string;
  readonly id: string;
}

const PAGE_KEY = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z)\|([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;

/** ListRuns tokens are opaque to clients: base64url of "<page_key>|<run id>". */
export function encodeRunsPageToken(key: RunsPageKey): string {
  return Buffer.from(`${key.createdAt}|${key.id}`, "utf8").toString("base64url");
}

/**
 * The key a token carries, or undefined for anything this server did not issue (a token of the
 * old millisecond form included), so that the API refuses it as the caller's mistake instead of
 * PostgreSQL failing a cast.
 */
export function parseRunsPageToken(token: string): RunsPageKey | undefined {
  const match = PAGE_KEY.exec(Buffer.from(token, "base64url").toString("utf8"));
  const [, createdAt, id] = match ?? [];
  if (createdAt === undefined || id === undefined) return undefined;
  // A real instant: the pattern alone lets through 2026-02-31 and 25:00.
  const ms = Date.parse(createdAt);
  if (Number.isNaN(ms) || new Date(ms).toISOString().slice(0, 23) !== createdAt.slice(0, 23)) return undefined;
  return { createdAt, id };
}
