import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** An agent's specification, stored whole as the proto's JSON form; revision rises on each put. */
export const AgentEntity = defineEntity({
  name: "Agent",
  tableName: "agents",
  properties: {
    id: p.text().primary(),
    spec: p.json<Record<string, unknown>>(),
    /**
     * The spec's policy, kept beside it: every step commit reads a run's policy, and a spec of a
     * few KiB is stored compressed, so reading it from the spec decompressed the whole spec each time.
     */
    policy: p.json<Record<string, unknown>>().generated("(spec -> 'policy') stored").nullable(),
    revision: p.integer(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()"),
  },
});
