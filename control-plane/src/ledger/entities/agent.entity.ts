import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** An agent's specification, stored whole as the proto's JSON form; revision rises on each put. */
export const AgentEntity = defineEntity({
  name: "Agent",
  tableName: "agents",
  properties: {
    id: p.text().primary(),
    spec: p.json<Record<string, unknown>>(),
    revision: p.integer(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()"),
  },
});
