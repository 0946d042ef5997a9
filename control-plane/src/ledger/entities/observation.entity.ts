import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";
import { ToolInvocationEntity } from "./tool-invocation.entity.js";

const p = defineEntity.properties;

/** A chunk a tool observed, stored as it arrived; compaction points back here by id. */
export const ObservationEntity = defineEntity({
  name: "Observation",
  tableName: "observations",
  uniques: [{ properties: ["toolInvocationId", "seq"] }],
  indexes: [{ properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    toolInvocationId: () => references(ToolInvocationEntity, "tool_invocation_id"),
    seq: p.integer(),
    stream: p.text(),
    text: p.text(),
    truncated: p.boolean().default(false),
    observedAt: p.datetime().defaultRaw("now()"),
  },
});
