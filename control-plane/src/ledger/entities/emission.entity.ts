import { defineEntity } from "@mikro-orm/core";

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
    runId: p.uuid().nullable(),
    agentId: p.text(),
    conversationId: p.uuid(),
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
