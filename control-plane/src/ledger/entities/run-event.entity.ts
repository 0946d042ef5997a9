import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** The dense, per-run event sequence WatchRun replays and tails. */
export const RunEventEntity = defineEntity({
  name: "RunEvent",
  tableName: "run_events",
  properties: {
    runId: p.uuid().primary(),
    seq: p.integer().primary(),
    kind: p.text(),
    status: p.text().nullable(),
    stepId: p.uuid().nullable(),
    toolInvocationId: p.uuid().nullable(),
    summary: p.text().default(""),
    // The statement's own time, not its transaction's: a claim that waited on a lock is
    // stamped after the commit it waited for, so the ledger orders claims and settles truly.
    at: p.datetime().defaultRaw("clock_timestamp()"),
  },
});
