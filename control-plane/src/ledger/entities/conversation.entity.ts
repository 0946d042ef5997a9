import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** One (agent, conversation) pair: the mailbox that owns at most one root run in flight. */
export const ConversationEntity = defineEntity({
  name: "Conversation",
  tableName: "conversations",
  uniques: [{ properties: ["agentId", "externalId"] }],
  properties: {
    id: p.uuid().primary(),
    agentId: p.text(),
    externalId: p.text(),
    connector: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
