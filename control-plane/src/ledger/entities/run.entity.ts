import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/**
 * A durable run. The lease columns (owner, epoch, expiry) fence workers: every commit
 * checks the epoch it claimed with, so a worker whose lease was taken cannot write.
 */
export const RunEntity = defineEntity({
  name: "Run",
  tableName: "runs",
  indexes: [
    { properties: ["status", "notBefore"] },
    { properties: ["agentId", "conversationId", "createdAt"] },
    { properties: ["conversationId", "status"] },
  ],
  properties: {
    id: p.uuid().primary(),
    agentId: p.text(),
    conversationId: p.uuid(),
    connector: p.text(),
    status: p.text(),
    waitReason: p.text().nullable(),
    shape: p.text().default("loop"),
    commitBoundary: p.text().default("buffering"),
    parentRunId: p.uuid().nullable(),
    rootRunId: p.uuid().nullable(),
    supersededByRunId: p.uuid().nullable(),
    continuationOfRunId: p.uuid().nullable(),
    requestedByActorId: p.text(),
    replyToMessageId: p.text().nullable(),
    budget: p.json<Record<string, number>>(),
    usage: p.json<Record<string, number>>(),
    finalReply: p.text().nullable(),
    error: p.text().nullable(),
    exhaustedDimension: p.text().nullable(),
    stepCount: p.integer().default(0),
    eventSeq: p.integer().default(0),
    paused: p.boolean().default(false),
    cancelRequestedByActorId: p.text().nullable(),
    cancelReason: p.text().nullable(),
    leaseOwner: p.text().nullable(),
    leaseEpoch: p.bigint("number").default(0),
    leaseExpiresAt: p.datetime().nullable(),
    notBefore: p.datetime().defaultRaw("now()"),
    startedAt: p.datetime().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()"),
    finishedAt: p.datetime().nullable(),
  },
});
