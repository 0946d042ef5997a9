import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** One loop iteration with its model call, committed in the same transaction as its tool calls and the run's status. */
export const RunStepEntity = defineEntity({
  name: "RunStep",
  tableName: "run_steps",
  uniques: [{ properties: ["runId", "index"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    index: p.integer(),
    replayability: p.text(),
    runStatusAfter: p.text(),
    // No foreign key: the actor of an answer or decision may be an operator acting through a token.
    actorId: p.text().nullable(),
    /** What the runner told the model after this step: an invalid turn, an unmet completion contract. */
    feedback: p.text().nullable(),
    leaseEpoch: p.bigint("number"),
    startedAt: p.datetime(),
    committedAt: p.datetime().defaultRaw("now()"),
    /** The number and summary of the step's event, which run_event_feed reads from this row (Migration20261229000000). */
    eventSeq: p.integer().nullable(),
    eventSummary: p.text().nullable(),
    /**
     * The step's model call, written with the step: its id, request (as stored: a delta on the
     * run's earlier requests, its tool list by reference), response and usage. Null for a step
     * without a call. Calls beside the loop are side_model_calls; model_calls shows both.
     */
    callId: p.uuid().nullable(),
    callRole: p.text().nullable(),
    callProvider: p.text().nullable(),
    callModel: p.text().nullable(),
    callRequest: p.json<unknown>().nullable(),
    callResponseText: p.text().nullable(),
    callToolCalls: p.json<unknown>().nullable(),
    callInputTokens: p.integer().nullable(),
    callOutputTokens: p.integer().nullable(),
    callLatencyMs: p.integer().nullable(),
    callFinishReason: p.text().nullable(),
    callCostMicroUsd: p.bigint("number").nullable(),
  },
});
