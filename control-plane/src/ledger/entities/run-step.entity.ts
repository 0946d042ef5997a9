import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** One loop iteration, committed in the same transaction as its model call, tool calls and the run's status. */
export const RunStepEntity = defineEntity({
  name: "RunStep",
  tableName: "run_steps",
  uniques: [{ properties: ["runId", "index"] }],
  properties: {
    id: p.uuid().primary(),
    runId: p.uuid(),
    index: p.integer(),
    replayability: p.text(),
    runStatusAfter: p.text(),
    actorId: p.text().nullable(),
    /** What the runner told the model after this step: an invalid turn, an unmet completion contract. */
    feedback: p.text().nullable(),
    leaseEpoch: p.bigint("number"),
    startedAt: p.datetime(),
    committedAt: p.datetime().defaultRaw("now()"),
  },
});
