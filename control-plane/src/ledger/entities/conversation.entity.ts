import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { AgentEntity } from "./agent.entity.js";

const p = defineEntity.properties;

/** One (agent, conversation) pair: the mailbox that owns at most one root run in flight. */
export const ConversationEntity = defineEntity({
  name: "Conversation",
  tableName: "conversations",
  uniques: [{ properties: ["agentId", "externalId"] }],
  properties: {
    id: p.uuid().primary(),
    agentId: () => references(AgentEntity, "agent_id"),
    externalId: p.text(),
    connector: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
