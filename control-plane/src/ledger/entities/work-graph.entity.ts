import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** A root run's admitted WorkGraph; revisions and replans are counted against its ceilings. */
export const WorkGraphEntity = defineEntity({
  name: "WorkGraph",
  tableName: "work_graphs",
  properties: {
    id: p.uuid().primary(),
    rootRunId: () => references(RunEntity, "root_run_id").unique(),
    revision: p.integer().default(0),
    replans: p.integer().default(0),
    aggregateUsage: p.json<Record<string, number>>(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
