import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/**
 * A chunk a tool observed, stored as it arrived. A call's result is not stored here again: readers
 * use the view call_observations, which adds it last (Migration20261226000000). Every writer
 * selects the call it names (the fenced commit settles it by key, a streamed append finds it in its
 * run), so tool_invocation_id carries no foreign key (Migration20261224000000).
 */
export const ObservationEntity = defineEntity({
  name: "Observation",
  tableName: "observations",
  uniques: [{ properties: ["toolInvocationId", "seq"] }],
  indexes: [{ properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    toolInvocationId: p.uuid().fieldName("tool_invocation_id"),
    seq: p.integer(),
    stream: p.text(),
    text: p.text(),
    truncated: p.boolean().default(false),
    observedAt: p.datetime().defaultRaw("now()"),
  },
});
