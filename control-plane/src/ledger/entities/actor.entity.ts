import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A person or system that speaks in a conversation; ids are the connector's own. */
export const ActorEntity = defineEntity({
  name: "Actor",
  tableName: "actors",
  properties: {
    id: p.text().primary(),
    displayName: p.text().default(""),
    firstSeenAt: p.datetime().defaultRaw("now()"),
  },
});
