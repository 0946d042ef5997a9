import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A message that caused or joined a run; merged runs keep every trigger. */
export const RunTriggerEntity = defineEntity({
  name: "RunTrigger",
  tableName: "run_triggers",
  indexes: [{ properties: ["messageId"] }],
  properties: {
    runId: p.uuid().primary(),
    messageId: p.uuid().primary(),
    actorId: p.text(),
    externalMessageId: p.text(),
    receivedAt: p.datetime().defaultRaw("now()"),
    /** initial, coalesced, refines, amends, cancels, edit or continues. */
    relation: p.text().default("initial"),
    /** Where the model sees it: after this many of the run's own steps. */
    afterStep: p.integer().default(0),
    /** Carried over from the run this one superseded or continues; shown with the inherited work. */
    inherited: p.boolean().default(false),
    /** Arrival order within the run (carried triggers keep theirs); ties in received_at never reorder a transcript. */
    ordinal: p.integer().default(0),
  },
});
