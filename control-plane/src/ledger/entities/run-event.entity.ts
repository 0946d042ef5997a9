import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";

const p = defineEntity.properties;

/**
 * The dense, per-run event sequence WatchRun replays and tails. step_id and tool_invocation_id
 * name rows written in the same statement as the event; they carry no foreign key, so an event
 * costs no key check or index entry beyond its own (Migration20261223000000).
 */
export const RunEventEntity = defineEntity({
  name: "RunEvent",
  tableName: "run_events",
  properties: {
    runId: () => references(RunEntity, "run_id").primary(),
    seq: p.integer().primary(),
    kind: p.text(),
    status: p.text().nullable(),
    stepId: p.uuid().fieldName("step_id").nullable(),
    toolInvocationId: p.uuid().fieldName("tool_invocation_id").nullable(),
    summary: p.text().default(""),
    // The statement's own time, not its transaction's: a claim that waited on a lock is
    // stamped after the commit it waited for, so the ledger orders claims and settles truly.
    at: p.datetime().defaultRaw("clock_timestamp()"),
  },
});
