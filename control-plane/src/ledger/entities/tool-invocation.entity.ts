import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { ModelCallEntity } from "./model-call.entity.js";
import { RunEntity } from "./run.entity.js";
import { RunStepEntity } from "./run-step.entity.js";

const p = defineEntity.properties;

/** A tool call. Its row (the intent) commits before dispatch; status says what became of it. */
export const ToolInvocationEntity = defineEntity({
  name: "ToolInvocation",
  tableName: "tool_invocations",
  // No index holds status: settling a call (status, result) is then a HOT update that writes no
  // index entry (Migration20261222000000 also leaves room on each page for it).
  indexes: [{ properties: ["runId"] }, { properties: ["stepId"] }, { name: "tool_invocations_model_call_id_index", expression: 'create index "tool_invocations_model_call_id_index" on "tool_invocations" ("model_call_id") where "model_call_id" is not null' }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    stepId: () => references(RunStepEntity, "step_id").nullable(),
    modelCallId: () => references(ModelCallEntity, "model_call_id").nullable(),
    providerCallId: p.text(),
    ordinal: p.integer(),
    toolName: p.text(),
    toolVersion: p.text(),
    effect: p.text(),
    arguments: p.json<unknown>(),
    status: p.text(),
    refusalReason: p.text().nullable(),
    resultText: p.text().nullable(),
    exitCode: p.integer().nullable(),
    durationMs: p.integer().nullable(),
    outputTruncated: p.boolean().default(false),
    resolvedOutcome: p.text().nullable(),
    // No foreign key: unknown outcomes are resolved by operators, who need not be conversation actors.
    resolvedByActorId: p.text().nullable(),
    resolutionReason: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
    finishedAt: p.datetime().nullable(),
  },
});
