import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { EmissionEntity } from "./emission.entity.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** Progress copy and receipts, kept apart from assistant history; one reservation per subject and sequence. */
export const ProgressEventEntity = defineEntity({
  name: "ProgressEvent",
  tableName: "progress_events",
  uniques: [{ properties: ["subject", "seq"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    subject: p.text(),
    seq: p.integer(),
    emissionId: () => references(EmissionEntity, "emission_id").nullable(),
    text: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
