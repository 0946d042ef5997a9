// The reads and writes of edits and continuations, inside an admission attempt's transaction.
import { randomUUID } from "node:crypto";
import type { FollowUpLedger } from "../conversation/admission-ledger.js";
import type { AgentSpec } from "../domain/agent.js";
import { CONVERSATION_RUN_COLUMNS, toConversationRun, type ConversationRunRow } from "./conversation-run.rows.js";
import { statement, type SqlTransaction } from "./sql.js";

const lockConversationStatement = statement<{ agentId: string; externalId: string }, { id: string; spec: AgentSpec }>("follow_up_lock_conversation")`
  SELECT c.id, a.spec FROM conversations c JOIN agents a ON a.id = c.agent_id
  WHERE c.agent_id = ${(p) => p.agentId} AND c.external_id = ${(p) => p.externalId} FOR NO KEY UPDATE OF c`;

const originalMessageStatement = statement<
  { conversationId: string; externalId: string },
  { id: string; actor_id: string; run_id: string | null; latest_text: string; edits: number; connector: string }
>("follow_up_original_message")`
  SELECT m.id, m.actor_id, m.run_id, c.connector,
    coalesce((SELECT e.text FROM messages e WHERE e.edit_of_message_id = m.id ORDER BY e.created_at DESC, e.external_id DESC LIMIT 1), m.text) AS latest_text,
    (SELECT count(*)::int FROM messages e WHERE e.edit_of_message_id = m.id) AS edits
  FROM messages m JOIN conversations c ON c.id = m.conversation_id
  WHERE m.conversation_id = ${(p) => p.conversationId}::uuid AND m.external_id = ${(p) => p.externalId} AND m.edit_of_message_id IS NULL`;

const latestVersionStatement = statement<{ originalId: string }, { run_id: string | null }>("follow_up_latest_version")`
  SELECT run_id FROM messages WHERE id = ${(p) => p.originalId}::uuid OR edit_of_message_id = ${(p) => p.originalId}::uuid
  ORDER BY created_at DESC LIMIT 1`;

interface EditParams {
  readonly rowId: string;
  readonly conversationId: string;
  readonly externalId: string;
  readonly actorId: string;
  readonly text: string;
  readonly originalId: string;
  readonly now: Date;
}
const storeEditStatement = statement<EditParams>("follow_up_store_edit")`
  WITH edit AS (
    INSERT INTO messages (id, conversation_id, external_id, actor_id, text, edit_of_message_id)
    VALUES (${(p) => p.rowId}::uuid, ${(p) => p.conversationId}::uuid, ${(p) => p.externalId}, ${(p) => p.actorId}, ${(p) => p.text},
      ${(p) => p.originalId}::uuid))
  UPDATE messages SET edited_at = ${(p) => p.now}::timestamptz WHERE id = ${(p) => p.originalId}::uuid`;

const runsCarryingStatement = statement<{ originalId: string }, { run_id: string }>("follow_up_runs_carrying")`
  SELECT DISTINCT t.run_id FROM run_triggers t JOIN messages m ON m.id = t.message_id
  WHERE m.id = ${(p) => p.originalId}::uuid OR m.edit_of_message_id = ${(p) => p.originalId}::uuid`;

const continuableRunStatement = statement<
  { runId: string },
  ConversationRunRow & { agent_spec: AgentSpec; conversation_id: string; external_id: string; parent_run_id: string | null }
>("follow_up_continuable_run")`
  SELECT ${CONVERSATION_RUN_COLUMNS}, r.conversation_id, r.parent_run_id, c.external_id, a.spec AS agent_spec
  FROM runs r JOIN conversations c ON c.id = r.conversation_id JOIN agents a ON a.id = r.agent_id
  WHERE r.id = ${(p) => p.runId}::uuid FOR NO KEY UPDATE OF r`;

const continuationStatement = statement<{ runId: string }, { id: string; external_message_id: string | null }>("follow_up_continuation")`
  SELECT k.id, (SELECT t.external_message_id FROM run_triggers t WHERE t.run_id = k.id AND t.relation = 'continues' LIMIT 1) AS external_message_id
  FROM runs k WHERE k.continuation_of_run_id = ${(p) => p.runId}::uuid`;

interface ReplyParams {
  readonly rowId: string;
  readonly conversationId: string;
  readonly actorId: string;
  readonly externalId: string;
  readonly text: string;
}
const storeReplyStatement = statement<ReplyParams, { id: string }>("follow_up_store_reply")`
  WITH actor AS (INSERT INTO actors (id) VALUES (${(p) => p.actorId}) ON CONFLICT (id) DO NOTHING)
  INSERT INTO messages (id, conversation_id, external_id, actor_id, text)
  VALUES (${(p) => p.rowId}::uuid, ${(p) => p.conversationId}::uuid, ${(p) => p.externalId}, ${(p) => p.actorId}, ${(p) => p.text})
  ON CONFLICT (conversation_id, external_id) DO UPDATE SET external_id = messages.external_id RETURNING id`;

export function followUpLedger(trx: SqlTransaction): FollowUpLedger {
  return {
    async lockConversation(agentId, externalConversationId) {
      const [row] = await trx.run(lockConversationStatement, { agentId, externalId: externalConversationId });
      return row === undefined ? undefined : { agent: row.spec, conversationId: row.id, externalConversationId };
    },
    async originalMessage(conversationId, externalMessageId) {
      const [row] = await trx.run(originalMessageStatement, { conversationId, externalId: externalMessageId });
      if (row === undefined) return undefined;
      return { rowId: row.id, actorId: row.actor_id, runId: row.run_id ?? undefined, latestText: row.latest_text, edits: Number(row.edits), connector: row.connector };
    },
    async latestVersionRunId(original) {
      const [row] = await trx.run(latestVersionStatement, { originalId: original.rowId });
      return row?.run_id ?? undefined;
    },
    async storeEdit(conversationId, original, edit, now) {
      const rowId = randomUUID();
      await trx.run(storeEditStatement, { rowId, conversationId, ...edit, originalId: original.rowId, now });
      return rowId;
    },
    async runsCarrying(original) {
      return new Set((await trx.run(runsCarryingStatement, { originalId: original.rowId })).map((row) => row.run_id));
    },
    async continuableRun(runId) {
      const [row] = await trx.run(continuableRunStatement, { runId });
      if (row === undefined) return undefined;
      return {
        ...toConversationRun(row),
        isRoot: row.parent_run_id === null,
        address: { agent: row.agent_spec, conversationId: row.conversation_id, externalConversationId: row.external_id },
      };
    },
    async continuationOf(runId) {
      const [row] = await trx.run(continuationStatement, { runId });
      return row === undefined ? undefined : { runId: row.id, externalMessageId: row.external_message_id ?? undefined };
    },
    async storeReply(conversationId, actorId, externalId, text) {
      const [row] = await trx.run(storeReplyStatement, { rowId: randomUUID(), conversationId, actorId, externalId, text });
      if (row === undefined) throw new Error(`reply ${externalId} was not stored`);
      return row.id;
    },
  };
}
