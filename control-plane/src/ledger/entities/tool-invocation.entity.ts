import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/**
 * A tool call. Its row (the intent) commits before dispatch; status says what became of it.
 * step_id and model_call_id name rows the same fenced statement writes, so they carry no foreign
 * key (Migration20261224000000); the key to the run stays.
 */
export const ToolInvocationEntity = defineEntity({
  name: "ToolInvocation",
  tableName: "tool_invocations",
  // No index holds status: settling a call (status, result) is then a HOT update that writes no
  // index entry (Migration20261222000000 also leaves room on each page for it).
  // A run's calls and a step's share one index, an entry per row (Migration20261230000000).
  indexes: [{ properties: ["runId", "stepId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    stepId: p.uuid().fieldName("step_id").nullable(),
    modelCallId: p.uuid().fieldName("model_call_id").nullable(),
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
    /** The number of the event of its settling in a fenced commit, which run_event_feed reads from this row. */
    settledSeq: p.integer().nullable(),
  },
});
