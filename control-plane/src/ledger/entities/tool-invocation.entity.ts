import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A tool call. Its row (the intent) commits before dispatch; status says what became of it. */
export const ToolInvocationEntity = defineEntity({
  name: "ToolInvocation",
  tableName: "tool_invocations",
  indexes: [{ properties: ["runId", "status"] }, { properties: ["stepId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: p.uuid(),
    stepId: p.uuid().nullable(),
    modelCallId: p.uuid().nullable(),
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
    resolvedByActorId: p.text().nullable(),
    resolutionReason: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
    finishedAt: p.datetime().nullable(),
  },
});
