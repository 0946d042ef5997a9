// A conversation's root run as admission reads it: its columns, its row and its mapping.
import type { ConversationRun } from "../conversation/admission-ledger.js";
import type { CommitBoundary, RunStatus } from "../domain/run.js";
import { fragment, raw } from "./sql.js";

export interface ConversationRunRow {
  id: string;
  status: RunStatus;
  connector: string;
  started_at: Date | null;
  not_before: Date;
  created_at: Date;
  request_received_at: Date | null;
  commit_boundary: CommitBoundary;
  graph_running: boolean;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  logical_request_id: string | null;
  interruptions: number;
  cancel_requested_by_actor_id: string | null;
  continued: boolean;
  actors: string[] | null;
  request_text: string | null;
}

/**
 * A root run's commit boundary, counting its WorkGraph's child runs: a child's effectful step is
 * the root's too (a node attempt that wrote is as unrepeatable as a step of the root), so once
 * any child crossed the boundary a refinement amends the root instead of restarting its graph,
 * and a cancel stops it with its partial result.
 */
export const ROOT_COMMIT_BOUNDARY_SQL = `CASE WHEN r.commit_boundary = 'committed' OR EXISTS (
    SELECT 1 FROM runs child WHERE child.root_run_id = r.id AND child.commit_boundary = 'committed') THEN 'committed' ELSE r.commit_boundary END`;

/** The columns of ConversationRunRow for a run `r`. */
export const CONVERSATION_RUN_COLUMNS = fragment`r.id, r.status, r.connector, r.started_at, r.not_before, r.created_at, r.request_received_at,
  ${raw(ROOT_COMMIT_BOUNDARY_SQL)} AS commit_boundary, r.requested_by_actor_id, r.reply_to_message_id, r.logical_request_id, r.interruptions, r.cancel_requested_by_actor_id,
  EXISTS (SELECT 1 FROM runs k WHERE k.continuation_of_run_id = r.id) AS continued,
  EXISTS (SELECT 1 FROM work_graphs g WHERE g.root_run_id = r.id AND g.status = 'running') AS graph_running,
  (SELECT json_agg(DISTINCT a.actor_id) FROM (
     SELECT t.actor_id FROM run_triggers t WHERE t.run_id = r.id AND t.relation <> 'cancels'
     UNION SELECT i.resolved_by_actor_id FROM tool_invocations i
     WHERE i.run_id = r.id AND i.tool_name = 'keel.ask_user.v1' AND i.resolved_by_actor_id IS NOT NULL) a) AS actors,
  (SELECT string_agg((SELECT m.text FROM messages m WHERE m.id = t.message_id), E'\\n' ORDER BY t.ordinal, t.received_at) FROM run_triggers t
   WHERE t.run_id = r.id AND t.relation <> 'cancels') AS request_text`;

export function toConversationRun(row: ConversationRunRow): ConversationRun {
  return {
    id: row.id,
    status: row.status,
    connector: row.connector,
    startedAt: row.started_at ?? undefined,
    notBefore: row.not_before,
    requestReceivedAt: row.request_received_at ?? row.created_at,
    commitBoundary: row.commit_boundary,
    graphRunning: row.graph_running,
    requestedByActorId: row.requested_by_actor_id,
    replyToMessageId: row.reply_to_message_id ?? undefined,
    logicalRequestId: row.logical_request_id ?? row.id,
    interruptions: Number(row.interruptions),
    cancelRequested: row.cancel_requested_by_actor_id !== null,
    continued: row.continued,
    actorIds: row.actors ?? [],
    requestText: row.request_text ?? "",
  };
}

