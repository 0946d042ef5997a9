import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { ActorEntity } from "./actor.entity.js";
import { ConversationEntity } from "./conversation.entity.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** A submitted message. (conversation, external id) is the idempotency key for SubmitMessage. */
export const MessageEntity = defineEntity({
  name: "Message",
  tableName: "messages",
  uniques: [{ properties: ["conversationId", "externalId"] }],
  indexes: [
    // Retention deletes a run's messages with it.
    { properties: ["runId"] },
    // An edit finds the edits of its message; partial, so the common insert (no edit) pays nothing for it.
    {
      name: "messages_edit_of_message_id_index",
      expression: 'create index "messages_edit_of_message_id_index" on "messages" ("edit_of_message_id") where "edit_of_message_id" is not null',
    },
  ],
  properties: {
    id: p.uuid().primary(),
    conversationId: () => references(ConversationEntity, "conversation_id"),
    externalId: p.text(),
    actorId: () => references(ActorEntity, "actor_id"),
    text: p.text(),
    replyToExternalId: p.text().nullable(),
    /**
     * Deferred: a message may name its run before the run's row is written in the same
     * transaction (the raw baselines in bench/ do); checked at commit.
     */
    runId: () => references(RunEntity, "run_id").nullable().deferMode("deferred"),
    editedAt: p.datetime().nullable(),
    /** Set on an edit's own row: the message it revises. The original row is never rewritten. */
    editOfMessageId: () => references(MessageEntity, "edit_of_message_id").nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
