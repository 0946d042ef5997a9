import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** One attempt at a node, classified for replayability like a RunStep. */
export const WorkNodeAttemptEntity = defineEntity({
  name: "WorkNodeAttempt",
  tableName: "work_node_attempts",
  uniques: [{ properties: ["nodeId", "ordinal"] }],
  properties: {
    id: p.uuid().primary(),
    nodeId: p.uuid(),
    ordinal: p.integer(),
    status: p.text(),
    replayability: p.text(),
    childRunId: p.uuid().nullable(),
    startedAt: p.datetime().defaultRaw("now()"),
    finishedAt: p.datetime().nullable(),
  },
});
