// The conversation side of the ledger for admission: one transaction per attempt, holding the
// conversation's row lock from the first statement to the commit, so a conversation's messages
// are decided one at a time against what is committed. SQL only; conversation/admission.ts decides.
import { randomUUID } from "node:crypto";
import type { AdmissionLedger, ConversationLedger, ConversationRuns } from "../conversation/admission-ledger.js";
import type { SubmittedMessage } from "../conversation/ingress.js";
import type { AgentSpec } from "../domain/agent.js";
import { NotFoundError } from "../domain/errors.js";
import type { RunStatus } from "../domain/run.js";
import { CONVERSATION_RUN_COLUMNS, toConversationRun, type ConversationRunRow } from "./conversation-run.rows.js";
import { followUpLedger } from "./follow-up.repository.js";
import { appendRunEvents } from "./ledger-writes.js";
import { runAdmissionWrites } from "./run-admission.repository.js";
import { LIVE_SQL } from "./run-start.sql.js";
import { asProgress, latestProgressSql } from "./run-history.repository.js";
import { fragment, raw, statement, type Sql, type SqlTransaction } from "./sql.js";

interface StoreMessageParams {
  readonly message: SubmittedMessage;
  readonly conversationRowId: string;
  readonly messageRowId: string;
}
const msg = (p: StoreMessageParams) => p.message;

/** The agent, the actor, the conversation (whose row lock serializes its messages) and the message, idempotent on its id. */
const storeMessageStatement = statement<
  StoreMessageParams,
  { spec: AgentSpec | null; conversation_id: string | null; message_row_id: string | null; existing_run_id: string | null; existing_status: RunStatus | null }
>("admission_store_message")`
  WITH agent AS (SELECT spec FROM agents WHERE id = ${(p) => msg(p).agentId}),
  actor AS (
    INSERT INTO actors (id, display_name) SELECT ${(p) => msg(p).actorId}, ${(p) => msg(p).actorDisplayName} FROM agent
    ON CONFLICT (id) DO UPDATE SET display_name = EXCLUDED.display_name
    WHERE EXCLUDED.display_name <> '' AND actors.display_name <> EXCLUDED.display_name),
  conversation AS (
    INSERT INTO conversations (id, agent_id, external_id, connector)
    SELECT ${(p) => p.conversationRowId}::uuid, ${(p) => msg(p).agentId}, ${(p) => msg(p).conversationId}, ${(p) => msg(p).connector} FROM agent
    ON CONFLICT (agent_id, external_id) DO UPDATE SET connector = conversations.connector
    RETURNING id),
  message AS (
    INSERT INTO messages (id, conversation_id, external_id, actor_id, text, reply_to_external_id)
    SELECT ${(p) => p.messageRowId}::uuid, conversation.id, ${(p) => msg(p).messageId}, ${(p) => msg(p).actorId}, ${(p) => msg(p).text},
      ${(p) => msg(p).replyToMessageId ?? null}::text
    FROM conversation
    ON CONFLICT (conversation_id, external_id) DO NOTHING RETURNING id)
  SELECT (SELECT spec FROM agent) AS spec, (SELECT id FROM conversation) AS conversation_id,
    (SELECT id FROM message) AS message_row_id,
    (SELECT m.run_id FROM messages m JOIN conversation c ON m.conversation_id = c.id WHERE m.external_id = ${(p) => msg(p).messageId}) AS existing_run_id,
    (SELECT r.status FROM messages m JOIN conversation c ON m.conversation_id = c.id JOIN runs r ON r.id = m.run_id
     WHERE m.external_id = ${(p) => msg(p).messageId}) AS existing_status`;

interface ConversationRunsParams {
  readonly agentId: string;
  /** The connector's id of the conversation. */
  readonly externalId: string;
}

/** A run of the conversation, each row with the conversation's latest progress notices. */
type ConversationRunsRow = ConversationRunRow & { earlier_progress: { text: string; created_at: string }[] };

const theConversation = fragment<ConversationRunsParams>`(SELECT id FROM conversation)`;

/**
 * The conversation's live root runs and its latest one (whatever its status), locked, each row
 * with the conversation's latest progress notices (an InitPlan, evaluated once). A conversation
 * without runs has no rows and no notices, so none are lost. Found by the connector's id, so it
 * needs nothing from the statement storing a message and goes in the same round trip. The live
 * runs and the latest are found apart, each by its own index: one filter over both would read
 * every run the conversation ever had, on every message.
 */
const conversationRunsStatement = statement<ConversationRunsParams, ConversationRunsRow>("admission_conversation_runs")`
  WITH conversation AS (SELECT id FROM conversations WHERE agent_id = ${(p) => p.agentId} AND external_id = ${(p) => p.externalId})
  SELECT ${CONVERSATION_RUN_COLUMNS},
    (SELECT coalesce(json_agg(json_build_object('text', p.text, 'created_at', p.created_at) ORDER BY p.created_at DESC, p.seq DESC), '[]'::json)
     FROM (${latestProgressSql<ConversationRunsParams>(theConversation)}) p) AS earlier_progress
  FROM runs r
  WHERE r.id IN (
      SELECT l.id FROM runs l WHERE l.conversation_id = ${theConversation} AND l.status IN (${raw(LIVE_SQL)}) AND l.parent_run_id IS NULL
      UNION ALL
      (SELECT n.id FROM runs n WHERE n.agent_id = ${(p) => p.agentId} AND n.conversation_id = ${theConversation}
       AND n.parent_run_id IS NULL ORDER BY n.created_at DESC, n.id DESC LIMIT 1))
  ORDER BY r.created_at, r.id
  FOR NO KEY UPDATE OF r`;

const asConversationRuns = (rows: ConversationRunsRow[]): ConversationRuns => ({
  runs: rows.map(toConversationRun),
  earlierProgress: asProgress(rows[0]?.earlier_progress ?? []),
});

const attachMessageStatement = statement<{ runId: string | null; messageRowId: string }>("admission_attach_message")`
  UPDATE messages SET run_id = ${(p) => p.runId}::uuid WHERE id = ${(p) => p.messageRowId}::uuid`;
const runStatusStatement = statement<{ runId: string }, { status: RunStatus }>("admission_run_status")`
  SELECT status FROM runs WHERE id = ${(p) => p.runId}::uuid`;

function conversationLedger(trx: SqlTransaction): ConversationLedger {
  return {
    async storeMessage(message) {
      // The runs are read after the message is stored, with the conversation's row locked, in the same round trip.
      const [[stored], runs] = await trx.runBoth(
        storeMessageStatement,
        { message, conversationRowId: randomUUID(), messageRowId: randomUUID() },
        conversationRunsStatement,
        { agentId: message.agentId, externalId: message.conversationId },
      );
      if (stored?.spec === null || stored?.spec === undefined || stored.conversation_id === null) throw new NotFoundError("agent", message.agentId);
      if (stored.message_row_id !== null) {
        return { kind: "stored", agent: stored.spec, conversationId: stored.conversation_id, messageRowId: stored.message_row_id, ...asConversationRuns(runs) };
      }
      // Another transaction stored this message id a moment ago; its outcome is not visible to this statement.
      if (stored.existing_run_id === null || stored.existing_status === null) return { kind: "concurrent" };
      return { kind: "duplicate", runId: stored.existing_run_id, status: stored.existing_status };
    },
    async conversationRuns(agentId, externalConversationId) {
      return asConversationRuns(await trx.run(conversationRunsStatement, { agentId, externalId: externalConversationId }));
    },
    ...runAdmissionWrites(trx),
    async attachMessage(runId, messageRowId) {
      await trx.run(attachMessageStatement, { runId: runId ?? null, messageRowId });
    },
    appendEvents: (runId, events) => appendRunEvents(trx, runId, events),
    wakeWorkers: (runId) => trx.notify("keel_runs", runId),
    async runStatus(runId) {
      const [run] = await trx.run(runStatusStatement, { runId });
      if (run === undefined) throw new NotFoundError("run", runId);
      return run.status;
    },
  };
}

export function createAdmissionLedger(sql: Sql): AdmissionLedger {
  return {
    // Admission's statements are planned once per connection: PostgreSQL would otherwise plan
    // most of them on every message, which cost more than running them.
    attempt: (work, keep) => sql.transaction((trx) => work({ ...conversationLedger(trx), ...followUpLedger(trx) }), keep, { plans: "generic" }),
  };
}
