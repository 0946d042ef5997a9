import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A message that caused or joined a run; merged runs keep every trigger. */
export const RunTriggerEntity = defineEntity({
  name: "RunTrigger",
  tableName: "run_triggers",
  properties: {
    runId: p.uuid().primary(),
    messageId: p.uuid().primary(),
    actorId: p.text(),
    externalMessageId: p.text(),
    receivedAt: p.datetime().defaultRaw("now()"),
  },
});
