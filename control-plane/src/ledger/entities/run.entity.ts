import { defineEntity } from "@mikro-orm/core";
import { EXECUTING_SQL } from "../run-start.sql.js";
import { references } from "./references.js";
import { ActorEntity } from "./actor.entity.js";
import { AgentEntity } from "./agent.entity.js";
import { ConversationEntity } from "./conversation.entity.js";

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
    { properties: ["logicalRequestId"] },
    // Retention finds old finished runs, and deleting one looks up the runs that point at it.
    { name: "runs_finished_at_index", expression: 'create index "runs_finished_at_index" on "runs" ("finished_at") where "finished_at" is not null' },
    { name: "runs_parent_run_id_index", expression: 'create index "runs_parent_run_id_index" on "runs" ("parent_run_id") where "parent_run_id" is not null' },
    { name: "runs_root_run_id_index", expression: 'create index "runs_root_run_id_index" on "runs" ("root_run_id") where "root_run_id" is not null' },
    { name: "runs_superseded_by_run_id_index", expression: 'create index "runs_superseded_by_run_id_index" on "runs" ("superseded_by_run_id") where "superseded_by_run_id" is not null' },
    { name: "runs_forked_from_run_id_index", expression: 'create index "runs_forked_from_run_id_index" on "runs" ("forked_from_run_id") where "forked_from_run_id" is not null' },
    { name: "runs_inherits_from_run_id_index", expression: 'create index "runs_inherits_from_run_id_index" on "runs" ("inherits_from_run_id") where "inherits_from_run_id" is not null' },
    // Every start counts the executing root runs against the ceilings (run-start.sql.ts).
    { name: "runs_executing_root_index", expression: `create index "runs_executing_root_index" on "runs" ("status", "agent_id") where "parent_run_id" is null and "status" in (${EXECUTING_SQL})` },
    // At most one continuation per exhausted run: one "yes" buys one fresh run.
    { name: "runs_continuation_of_run_id_unique", expression: 'create unique index "runs_continuation_of_run_id_unique" on "runs" ("continuation_of_run_id") where "continuation_of_run_id" is not null' },
  ],
  properties: {
    id: p.uuid().primary(),
    agentId: () => references(AgentEntity, "agent_id"),
    conversationId: () => references(ConversationEntity, "conversation_id"),
    connector: p.text(),
    status: p.text(),
    waitReason: p.text().nullable(),
    shape: p.text().default("loop"),
    commitBoundary: p.text().default("buffering"),
    parentRunId: () => references(RunEntity, "parent_run_id").nullable(),
    rootRunId: () => references(RunEntity, "root_run_id").nullable(),
    supersededByRunId: () => references(RunEntity, "superseded_by_run_id").nullable(),
    continuationOfRunId: () => references(RunEntity, "continuation_of_run_id").nullable(),
    /** The request a chain of supersessions answers: the first run's id. Acks are keyed on it. */
    logicalRequestId: () => references(RunEntity, "logical_request_id").nullable(),
    /** When the logical request's first message arrived, by the clock; the interrupt ceiling counts from here. */
    requestReceivedAt: p.datetime().nullable(),
    /** Supersessions and amendments the logical request has taken (the starvation bound). */
    interruptions: p.integer().default(0),
    /** Bumped with every trigger added, so a running worker knows to read its input again. */
    triggerCount: p.integer().default(0),
    /** The run whose completed work this one starts from (the run it superseded, or the exhausted run it continues). */
    inheritsFromRunId: () => references(RunEntity, "inherits_from_run_id").nullable(),
    /** An operator's fork (RunService.ForkRun): the source run, the source step it starts after, and why. */
    forkedFromRunId: () => references(RunEntity, "forked_from_run_id").nullable(),
    forkedAtStep: p.integer().nullable(),
    forkReason: p.text().nullable(),
    requestedByActorId: () => references(ActorEntity, "requested_by_actor_id"),
    replyToMessageId: p.text().nullable(),
    budget: p.json<Record<string, number>>(),
    usage: p.json<Record<string, number>>(),
    finalReply: p.text().nullable(),
    error: p.text().nullable(),
    exhaustedDimension: p.text().nullable(),
    stepCount: p.integer().default(0),
    eventSeq: p.integer().default(0),
    paused: p.boolean().default(false),
    // No foreign key: operators cancel through the API as token holders, who need not be conversation actors.
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
    /** The fast model's triage of a root run (domain/triage.ts); null until it lands. */
    triageDuration: p.text().nullable(),
    triageShape: p.text().nullable(),
    triageAckText: p.text().nullable(),
    /** Why triage used the defaults (slow, failed, absent, off-schema); null when the model answered. */
    triageFallback: p.text().nullable(),
    /** Tokens, cost and calls of model calls beside the loop; kept apart so step commits never overwrite it. */
    sideUsage: p.json<Record<string, number>>().defaultRaw("'{}'"),
    /** A child run of a WorkGraph: the agent spec keys it is claimed with instead of the agent's (tools, policy, slice). */
    specOverride: p.json<Record<string, unknown>>().nullable(),
  },
});
