import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A root run's admitted WorkGraph; revisions and replans are counted against its ceilings. */
export const WorkGraphEntity = defineEntity({
  name: "WorkGraph",
  tableName: "work_graphs",
  properties: {
    id: p.uuid().primary(),
    rootRunId: p.uuid().unique(),
    revision: p.integer().default(0),
    replans: p.integer().default(0),
    aggregateUsage: p.json<Record<string, number>>(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
