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
  indexes: [{ properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    subject: p.text(),
    seq: p.integer(),
    emissionId: () => references(EmissionEntity, "emission_id").nullable(),
    text: p.text(),
    /** What brought the notice: triage_ack, deadline, checkpoint or workspace. */
    source: p.text().default("deadline"),
    /** The candidates it said (report_progress invocation ids, "workspace"), so none is said twice. */
    covers: p.json<string[]>().defaultRaw("'[]'"),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
