import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** A root run's admitted WorkGraph; revisions and replans are counted against its ceilings. */
export const WorkGraphEntity = defineEntity({
  name: "WorkGraph",
  tableName: "work_graphs",
  // A replan is a new revision of the root's graph; the latest is the live one.
  uniques: [{ properties: ["rootRunId", "revision"] }],
  properties: {
    id: p.uuid().primary(),
    rootRunId: () => references(RunEntity, "root_run_id"),
    revision: p.integer().default(0),
    replans: p.integer().default(0),
    aggregateUsage: p.json<Record<string, number>>(),
    /** running, succeeded, failed or cancelled. */
    status: p.text().default("running"),
    /** The pending keel.propose_work_graph call that gets the graph's result (no foreign key: a call id is enough to find it). */
    proposedByInvocationId: p.uuid().nullable(),
    finishedAt: p.datetime().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
