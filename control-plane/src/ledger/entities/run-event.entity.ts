import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";
import { RunStepEntity } from "./run-step.entity.js";
import { ToolInvocationEntity } from "./tool-invocation.entity.js";

const p = defineEntity.properties;

/** The dense, per-run event sequence WatchRun replays and tails. */
export const RunEventEntity = defineEntity({
  name: "RunEvent",
  tableName: "run_events",
  // Deleting a step or an invocation (retention) looks up the events that name it.
  indexes: [{ name: "run_events_step_id_index", expression: 'create index "run_events_step_id_index" on "run_events" ("step_id") where "step_id" is not null' }, { name: "run_events_tool_invocation_id_index", expression: 'create index "run_events_tool_invocation_id_index" on "run_events" ("tool_invocation_id") where "tool_invocation_id" is not null' }],
  properties: {
    runId: () => references(RunEntity, "run_id").primary(),
    seq: p.integer().primary(),
    kind: p.text(),
    status: p.text().nullable(),
    stepId: () => references(RunStepEntity, "step_id").nullable(),
    toolInvocationId: () => references(ToolInvocationEntity, "tool_invocation_id").nullable(),
    summary: p.text().default(""),
    // The statement's own time, not its transaction's: a claim that waited on a lock is
    // stamped after the commit it waited for, so the ledger orders claims and settles truly.
    at: p.datetime().defaultRaw("clock_timestamp()"),
  },
});
