import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";
import { WorkNodeEntity } from "./work-node.entity.js";

const p = defineEntity.properties;

/** One attempt at a node, classified for replayability like a RunStep. */
export const WorkNodeAttemptEntity = defineEntity({
  name: "WorkNodeAttempt",
  tableName: "work_node_attempts",
  uniques: [{ properties: ["nodeId", "ordinal"] }],
  properties: {
    id: p.uuid().primary(),
    nodeId: () => references(WorkNodeEntity, "node_id"),
    ordinal: p.integer(),
    status: p.text(),
    replayability: p.text(),
    childRunId: () => references(RunEntity, "child_run_id").nullable(),
    startedAt: p.datetime().defaultRaw("now()"),
    finishedAt: p.datetime().nullable(),
  },
});
