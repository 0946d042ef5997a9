import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A submitted message. (conversation, external id) is the idempotency key for SubmitMessage. */
export const MessageEntity = defineEntity({
  name: "Message",
  tableName: "messages",
  uniques: [{ properties: ["conversationId", "externalId"] }],
  properties: {
    id: p.uuid().primary(),
    conversationId: p.uuid(),
    externalId: p.text(),
    actorId: p.text(),
    text: p.text(),
    replyToExternalId: p.text().nullable(),
    runId: p.uuid().nullable(),
    editedAt: p.datetime().nullable(),
    /** Set on an edit's own row: the message it revises. The original row is never rewritten. */
    editOfMessageId: p.uuid().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
