// Progress notices: what the supervisor (progress/progress-supervisor.ts) reads of a subject and
// its run, and the fenced reservation of a notice with its emission. SQL only.
import { randomUUID } from "node:crypto";
import { MAX_PROGRESS_TEXT_CHARS, PROGRESS_KINDS, REPORT_PROGRESS_TOOL, type ProgressActivity, type ProgressCandidate, type ProgressKind } from "../domain/progress.js";
import type { EmissionDraft } from "../domain/records.js";
import type { TriageDuration } from "../domain/triage.js";
import type { NoticeReservation, ProgressLedger, ProgressSnapshot } from "../progress/progress-supervisor.js";
import { emissionInsert, emissionRows, type EmissionRowsParams } from "./ledger-writes.js";
import { LIVE_SQL } from "./run-start.sql.js";
import { optionalDate, raw, statement, type Sql } from "./sql.js";

interface SnapshotRow {
  subject: string;
  triage_duration: string | null;
  triage_ack_text: string | null;
  last_seq: number;
  last_at: Date | null;
  covered: string[];
  checkpoints: { id: string; arguments: unknown }[];
  workspace_acquired: boolean;
  activity_tool: string | null;
  activity_arguments: unknown;
  activity_since: Date | null;
  status: string;
  asked_of: string[] | null;
}

/** The latest checkpoints only: a run that reports more than this between two notices says the newest anyway. */
const CHECKPOINT_WINDOW = 20;

/** How far back a chain of continuations is followed to find the request whose cadence it shares. */
const MAX_CONTINUATIONS = 20;

/**
 * The subject is the logical request of the first run in the chain of continuations: continuation
 * runs of one request share one cadence (and one sequence), as the seed asks.
 */
const loadSnapshot = statement<{ runId: string }, SnapshotRow>("progress_load", { plans: "generic" })`
  WITH RECURSIVE chain AS (
    SELECT r.continuation_of_run_id AS previous, coalesce(r.logical_request_id, r.id) AS request, 0 AS depth
    FROM runs r WHERE r.id = ${(p) => p.runId}::uuid
    UNION ALL
    SELECT p.continuation_of_run_id, coalesce(p.logical_request_id, p.id), chain.depth + 1
    FROM runs p JOIN chain ON p.id = chain.previous WHERE chain.depth < ${raw(String(MAX_CONTINUATIONS))}),
  subject AS (SELECT request::text AS subject FROM chain ORDER BY depth DESC LIMIT 1)
  SELECT s.subject, r.triage_duration, r.triage_ack_text, r.status,
    coalesce((SELECT max(pe.seq) FROM progress_events pe WHERE pe.subject = s.subject), 0)::int AS last_seq,
    (SELECT pe.created_at FROM progress_events pe WHERE pe.subject = s.subject ORDER BY pe.seq DESC LIMIT 1) AS last_at,
    (SELECT coalesce(jsonb_agg(c.ref), '[]'::jsonb) FROM progress_events pe, jsonb_array_elements_text(pe.covers) AS c(ref)
      WHERE pe.subject = s.subject) AS covered,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('id', x.id, 'arguments', x.arguments) ORDER BY x.step_index, x.ordinal), '[]'::jsonb)
      FROM (SELECT i.id, i.arguments, s.index AS step_index, i.ordinal FROM tool_invocations i JOIN run_steps s ON s.id = i.step_id
        WHERE i.run_id = r.id AND i.tool_name = ${raw(`'${REPORT_PROGRESS_TOOL}'`)}
        ORDER BY s.index DESC, i.ordinal DESC LIMIT ${raw(String(CHECKPOINT_WINDOW))}) x) AS checkpoints,
    EXISTS (SELECT 1 FROM workspaces w WHERE w.run_id = r.id AND w.status <> 'failed') AS workspace_acquired,
    a.tool_name AS activity_tool, a.arguments AS activity_arguments, a.since AS activity_since,
    (SELECT e.addressed_actor_ids FROM emissions e WHERE e.run_id = r.id AND e.kind = 'question' ORDER BY e.seq DESC LIMIT 1) AS asked_of
  FROM runs r CROSS JOIN subject s
  LEFT JOIN LATERAL (
    SELECT i.tool_name, i.arguments, s.started_at AS since FROM tool_invocations i JOIN run_steps s ON s.id = i.step_id
    WHERE i.run_id = r.id AND i.status = 'pending' AND i.tool_name <> ${raw(`'${REPORT_PROGRESS_TOOL}'`)}
    ORDER BY s.index DESC, i.ordinal LIMIT 1) a ON true
  WHERE r.id = ${(p) => p.runId}::uuid`;

interface ReserveParams extends EmissionRowsParams {
  readonly eventId: string;
  readonly notice: NoticeReservation;
}

/**
 * The notice and its emission in one statement (a notice is reserved per run per cadence tick,
 * and each round trip is a large share of the cost). The fence: the run is live, this claim
 * holds it, and nobody asked it to stop; FOR SHARE makes a settlement (which updates the row) wait
 * for this statement, or this one see it settled, so no notice lands after the run's reply.
 * The event goes in only with its emission: both are keyed by (subject, seq), so a second
 * supervisor drawing the same seq inserts neither.
 */
const reserveNotice = statement<ReserveParams, { reserved: number; connector: string }>("progress_reserve_notice")`
  WITH target AS (
    SELECT r.id, r.agent_id, r.conversation_id, c.external_id AS external_conversation_id, r.connector
    FROM runs r JOIN conversations c ON c.id = r.conversation_id
    WHERE r.id = ${(p) => p.notice.runId}::uuid AND r.lease_epoch = ${(p) => p.notice.epoch}::bigint AND r.lease_owner = ${(p) => p.notice.workerId}
      AND r.status IN (${raw(LIVE_SQL)}) AND r.cancel_requested_by_actor_id IS NULL AND r.superseded_by_run_id IS NULL
    FOR SHARE OF r),
  ${emissionInsert},
  event AS (
    INSERT INTO progress_events (id, run_id, conversation_id, subject, seq, text, source, covers, created_at, emission_id)
    SELECT ${(p) => p.eventId}::uuid, ${(p) => p.notice.runId}::uuid, t.conversation_id, ${(p) => p.notice.subject}, ${(p) => p.notice.seq}::int,
      ${(p) => p.notice.text}, ${(p) => p.notice.source}, ${(p) => JSON.stringify(p.notice.covers)}::jsonb, ${(p) => p.notice.at}::timestamptz, e.id
    FROM inserted e CROSS JOIN target t
    ON CONFLICT (subject, seq) DO NOTHING
    RETURNING id)
  SELECT (SELECT count(*)::int FROM event) AS reserved, t.connector FROM target t`;

function candidateOf(row: { id: string; arguments: unknown }): ProgressCandidate | undefined {
  const args = row.arguments as { kind?: unknown; text?: unknown } | null;
  const kind = PROGRESS_KINDS.find((k) => k === args?.kind);
  if (kind === undefined || typeof args?.text !== "string") return undefined;
  return { ref: row.id, kind: kind satisfies ProgressKind, text: args.text.slice(0, MAX_PROGRESS_TEXT_CHARS) };
}

/** A tool call's most telling argument, shown beside its name ("running sandbox.exec.v1 `npm test`"). */
function detailOf(args: unknown): string | undefined {
  if (args === null || typeof args !== "object") return undefined;
  const record = args as Record<string, unknown>;
  for (const key of ["command", "cmd", "path", "name", "query", "text"]) {
    const value = record[key];
    if (typeof value === "string") return value;
    if (Array.isArray(value) && value.every((v) => typeof v === "string")) return value.join(" ");
  }
  return undefined;
}

function activityOf(row: SnapshotRow): ProgressActivity {
  if (row.activity_tool !== null && row.activity_since !== null) {
    return { kind: "tool", toolName: row.activity_tool, detail: detailOf(row.activity_arguments), since: row.activity_since };
  }
  if (row.status === "awaiting_input") return { kind: "awaiting_input", askedOf: row.asked_of ?? [] };
  return { kind: "unknown" };
}

const TRIAGE_DURATIONS: readonly TriageDuration[] = ["long", "trivial", "default"];

export function createProgressRepository(db: Sql): ProgressLedger {
  return {
    async load(runId): Promise<ProgressSnapshot | undefined> {
      const [row] = await db.run(loadSnapshot, { runId });
      if (row === undefined) return undefined;
      const covered = new Set(row.covered);
      const candidates: ProgressCandidate[] = [];
      if (row.workspace_acquired && !covered.has("workspace")) candidates.push({ ref: "workspace", kind: "workspace", text: "" });
      for (const checkpoint of row.checkpoints) {
        const candidate = covered.has(checkpoint.id) ? undefined : candidateOf(checkpoint);
        if (candidate !== undefined) candidates.push(candidate);
      }
      return {
        subject: row.subject,
        triage: TRIAGE_DURATIONS.find((d) => d === row.triage_duration),
        ackText: row.triage_ack_text ?? undefined,
        lastSeq: row.last_seq,
        lastNoticeAt: optionalDate(row.last_at),
        candidates,
        activity: activityOf(row),
      };
    },

    async reserve(notice) {
      const emission: EmissionDraft = {
        kind: "progress",
        idempotencyKey: notice.idempotencyKey,
        text: notice.text,
        addressedActorIds: notice.addressedActorIds,
        ...(notice.replyToMessageId === undefined ? {} : { replyToMessageId: notice.replyToMessageId }),
      };
      const [row] = await db.run(reserveNotice, { eventId: randomUUID(), notice, emissions: emissionRows([emission]) });
      if (row === undefined || row.reserved === 0) return false;
      db.notify("keel_emissions", row.connector);
      return true;
    },
  };
}
