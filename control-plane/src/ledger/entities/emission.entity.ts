import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { AgentEntity } from "./agent.entity.js";
import { ConversationEntity } from "./conversation.entity.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/**
 * Something Keel says to a connector. The idempotency key is reserved when the row is
 * written, so a retry can never emit the same ack, progress note or reply twice.
 * seq is the connector's Subscribe cursor.
 */
export const EmissionEntity = defineEntity({
  name: "Emission",
  tableName: "emissions",
  indexes: [{ properties: ["connector", "seq"] }, { properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    seq: p.bigint("number").autoincrement().unique(),
    idempotencyKey: p.text().unique(),
    connector: p.text(),
    kind: p.text(),
    runId: () => references(RunEntity, "run_id").nullable(),
    agentId: () => references(AgentEntity, "agent_id"),
    conversationId: () => references(ConversationEntity, "conversation_id"),
    externalConversationId: p.text(),
    replyToMessageId: p.text().nullable(),
    text: p.text().default(""),
    ackState: p.text().nullable(),
    addressedActorIds: p.json<string[]>(),
    deliveryStatus: p.text().default("pending"),
    remoteRef: p.text().nullable(),
    deliveryDetail: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
    settledAt: p.datetime().nullable(),
  },
});
