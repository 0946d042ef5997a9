import { randomUUID } from "node:crypto";
import type { AgentSpec } from "../domain/agent.js";
import { NotFoundError } from "../domain/errors.js";
import type { RunStatus } from "../domain/run.js";
import { ZERO_USAGE } from "../domain/run.js";
import { ACK_WORKING_TEXT, type Admission, type IngressStore } from "../conversation/ingress.js";
import { appendRunEvents, reserveEmissions } from "./ledger-writes.js";
import { rows, type Sql } from "./sql.js";

export function createIngressRepository(sql: Sql): IngressStore {
  return {
    submitMessage: (message) =>
      sql.transaction(async (trx): Promise<Admission> => {
        const [agent] = await rows<{ spec: AgentSpec }>(trx, "SELECT spec FROM agents WHERE id = ?", [message.agentId]);
        if (agent === undefined) throw new NotFoundError("agent", message.agentId);

        await trx.raw(
          `INSERT INTO actors (id, display_name) VALUES (?, ?)
           ON CONFLICT (id) DO UPDATE SET display_name = EXCLUDED.display_name
           WHERE EXCLUDED.display_name <> '' AND actors.display_name <> EXCLUDED.display_name`,
          [message.actorId, message.actorDisplayName],
        );
        const [conversation] = await rows<{ id: string }>(
          trx,
          `INSERT INTO conversations (id, agent_id, external_id, connector) VALUES (?, ?, ?, ?)
           ON CONFLICT (agent_id, external_id) DO UPDATE SET connector = conversations.connector
           RETURNING id`,
          [randomUUID(), message.agentId, message.conversationId, message.connector],
        );
        const conversationId = conversation!.id;

        const messageRowId = randomUUID();
        const inserted = await rows<{ id: string }>(
          trx,
          `INSERT INTO messages (id, conversation_id, external_id, actor_id, text, reply_to_external_id)
           VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (conversation_id, external_id) DO NOTHING RETURNING id`,
          [messageRowId, conversationId, message.messageId, message.actorId, message.text, message.replyToMessageId ?? null],
        );
        if (inserted.length === 0) {
          const [existing] = await rows<{ run_id: string; status: RunStatus }>(
            trx,
            `SELECT m.run_id, r.status FROM messages m JOIN runs r ON r.id = m.run_id
             WHERE m.conversation_id = ? AND m.external_id = ?`,
            [conversationId, message.messageId],
          );
          if (existing === undefined) throw new Error(`message ${message.messageId} exists without a run`);
          return { runId: existing.run_id, status: existing.status, duplicate: true };
        }

        const runId = randomUUID();
        await trx("runs").insert({
          id: runId,
          agent_id: message.agentId,
          conversation_id: conversationId,
          connector: message.connector,
          status: "queued",
          requested_by_actor_id: message.actorId,
          reply_to_message_id: message.messageId,
          budget: JSON.stringify(agent.spec.budget),
          usage: JSON.stringify(ZERO_USAGE),
        });
        await trx.raw("UPDATE messages SET run_id = ? WHERE id = ?", [runId, messageRowId]);
        await trx("run_triggers").insert({
          run_id: runId,
          message_id: messageRowId,
          actor_id: message.actorId,
          external_message_id: message.messageId,
        });
        await appendRunEvents(trx, runId, [
          { kind: "created", status: "queued", summary: `message ${message.messageId} from ${message.actorId}` },
        ]);
        await reserveEmissions(
          trx,
          {
            runId,
            agentId: message.agentId,
            conversationId,
            externalConversationId: message.conversationId,
            connector: message.connector,
          },
          [
            {
              kind: "ack",
              idempotencyKey: `ack:${runId}:working`,
              text: ACK_WORKING_TEXT,
              ackState: "working",
              replyToMessageId: message.messageId,
              addressedActorIds: [message.actorId],
            },
          ],
        );
        await trx.raw("SELECT pg_notify('keel_runs', ?)", [runId]);
        return { runId, status: "queued", duplicate: false };
      }),
  };
}
