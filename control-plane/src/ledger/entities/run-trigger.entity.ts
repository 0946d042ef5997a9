import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { ActorEntity } from "./actor.entity.js";
import { MessageEntity } from "./message.entity.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** A message that caused or joined a run; merged runs keep every trigger. */
export const RunTriggerEntity = defineEntity({
  name: "RunTrigger",
  tableName: "run_triggers",
  indexes: [{ properties: ["messageId"] }],
  properties: {
    runId: () => references(RunEntity, "run_id").primary(),
    messageId: () => references(MessageEntity, "message_id").primary(),
    actorId: () => references(ActorEntity, "actor_id"),
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
