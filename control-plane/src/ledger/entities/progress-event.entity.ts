import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { ConversationEntity } from "./conversation.entity.js";
import { EmissionEntity } from "./emission.entity.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** Progress copy and receipts, kept apart from assistant history; one reservation per subject and sequence. */
export const ProgressEventEntity = defineEntity({
  name: "ProgressEvent",
  tableName: "progress_events",
  uniques: [{ properties: ["subject", "seq"] }],
  // A conversation's latest notices are read on every message to it, newest first.
  indexes: [{ properties: ["runId"] }, { properties: ["conversationId", "createdAt", "seq"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    /** The run's conversation, kept here so its latest notices are found without reading every run it had. */
    conversationId: () => references(ConversationEntity, "conversation_id"),
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
