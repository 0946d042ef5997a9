import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** Progress copy and receipts, kept apart from assistant history; one reservation per subject and sequence. */
export const ProgressEventEntity = defineEntity({
  name: "ProgressEvent",
  tableName: "progress_events",
  uniques: [{ properties: ["subject", "seq"] }],
  properties: {
    id: p.uuid().primary(),
    runId: p.uuid(),
    subject: p.text(),
    seq: p.integer(),
    emissionId: p.uuid().nullable(),
    text: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
