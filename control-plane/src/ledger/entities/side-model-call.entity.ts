import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/**
 * The request, response and usage of a model call made beside the loop (triage, follow-up
 * classification, continuation consent, progress), for audit and cost. A step's call is stored on
 * its step's row (run-step.entity.ts); the view model_calls shows both (Migration20261231000000).
 */
export const SideModelCallEntity = defineEntity({
  name: "SideModelCall",
  tableName: "side_model_calls",
  indexes: [{ properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    /** What the call was for: triage, follow_up, consent or progress. */
    purpose: p.text().nullable(),
    role: p.text(),
    provider: p.text(),
    model: p.text(),
    request: p.json<unknown>(),
    responseText: p.text(),
    toolCalls: p.json<unknown>(),
    inputTokens: p.integer(),
    outputTokens: p.integer(),
    latencyMs: p.integer(),
    finishReason: p.text(),
    costMicroUsd: p.bigint("number").default(0),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
