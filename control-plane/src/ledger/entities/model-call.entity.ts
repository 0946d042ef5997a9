import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/** The model request, response and usage of one call, for audit and cost. */
export const ModelCallEntity = defineEntity({
  name: "ModelCall",
  tableName: "model_calls",
  // One index for a run's calls and a step's (readers name the step's run too): an entry per row,
  // where one on run_id and one on step_id cost every iteration two (Migration20261230000000).
  indexes: [{ properties: ["runId", "stepId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    /**
     * No step for a fast- or decision-model call made beside the loop (triage, classification). A
     * step's call is written by the statement that writes the step: no foreign key (Migration20261224000000).
     */
    stepId: p.uuid().fieldName("step_id").nullable(),
    /** What a call beside the loop was for: triage, follow_up or consent; null for step calls. */
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
