// Model calls beside the loop (triage, follow-up classification, continuation consent) and the
// lifecycle acks between ⏳ and the mark. SQL only: conversation/side-calls.ts and
// runner/run-lifecycle.ts decide. Side usage accumulates in runs.side_usage, which step commits
// never write, so a worker holding the run cannot overwrite what a side call added.
import type { SideCallLedger } from "../conversation/side-calls.js";
import type { EmissionDraft } from "../domain/records.js";
import { sideUsageOf, usageOfSideCall, type SideCallUsage, type SideModelCall, type TriageOutcome } from "../domain/triage.js";
import type { RunLifecycle } from "../runner/run-lifecycle.js";
import { emissionInsert, emissionRows, type EmissionRowsParams } from "./ledger-writes.js";
import { LIVE_SQL } from "./run-start.sql.js";
import { raw, statement, type Sql } from "./sql.js";

interface SideCallParams {
  readonly call: SideModelCall;
  readonly usage: SideCallUsage;
}

/** The call and its usage in one statement: a call is never recorded without being counted. */
const recordSideCallStatement = statement<SideCallParams, { id: string }>("model_call_record_side")`
  WITH call AS (
    INSERT INTO side_model_calls (id, run_id, role, purpose, provider, model, request, response_text, tool_calls,
      input_tokens, output_tokens, latency_ms, finish_reason, cost_micro_usd)
    VALUES (${(p) => p.call.id}::uuid, ${(p) => p.call.runId}::uuid, ${(p) => p.call.role}, ${(p) => p.call.purpose},
      ${(p) => p.call.provider}, ${(p) => p.call.model}, ${(p) => JSON.stringify(p.call.request)}::jsonb, ${(p) => p.call.responseText}, '[]'::jsonb,
      ${(p) => p.call.inputTokens}::int, ${(p) => p.call.outputTokens}::int, ${(p) => p.call.latencyMs}::int, ${(p) => p.call.finishReason},
      ${(p) => p.call.costMicroUsd}::bigint)
    RETURNING run_id)
  UPDATE runs r SET side_usage = jsonb_build_object(
      'modelCalls', coalesce((r.side_usage ->> 'modelCalls')::bigint, 0) + ${(p) => p.usage.modelCalls}::bigint,
      'inputTokens', coalesce((r.side_usage ->> 'inputTokens')::bigint, 0) + ${(p) => p.usage.inputTokens}::bigint,
      'outputTokens', coalesce((r.side_usage ->> 'outputTokens')::bigint, 0) + ${(p) => p.usage.outputTokens}::bigint,
      'costMicroUsd', coalesce((r.side_usage ->> 'costMicroUsd')::bigint, 0) + ${(p) => p.usage.costMicroUsd}::bigint)
  FROM call WHERE r.id = call.run_id
  RETURNING r.id`;

interface TriageParams {
  readonly runId: string;
  readonly duration: string;
  readonly shape: string;
  readonly ackText: string | null;
  readonly fellBack: string | null;
}

/**
 * One triage per run: a second (a retried admission's) leaves the first. It commits with the fast
 * model's call behind it; a run whose agent has no fast model got its defaults at admission.
 */
const storeTriage = statement<TriageParams, { id: string }>("model_call_store_triage")`
  UPDATE runs SET triage_duration = ${(p) => p.duration}, triage_shape = ${(p) => p.shape},
    triage_ack_text = ${(p) => p.ackText}, triage_fallback = ${(p) => p.fellBack}
  WHERE id = ${(p) => p.runId}::uuid AND triage_duration IS NULL
  RETURNING id`;

/**
 * Started and thinking acks, in one statement, only while the claim holds the run and it is
 * live. FOR SHARE makes a concurrent settlement wait for this statement, or this one see it
 * settled: no started or thinking ack can land after the mark. Returns nothing when refused.
 */
const reserveAckRows = statement<EmissionRowsParams & { runId: string; epoch: number }, { connector: string; side_usage: Record<string, unknown>; n: number }>(
  "model_call_reserve_acks",
  { plans: "generic" },
)`
  WITH target AS (
    SELECT r.id, r.agent_id, r.conversation_id, c.external_id AS external_conversation_id, r.connector, r.side_usage
    FROM runs r JOIN conversations c ON c.id = r.conversation_id
    WHERE r.id = ${(p) => p.runId}::uuid AND r.lease_epoch = ${(p) => p.epoch}::bigint AND r.status IN (${raw(LIVE_SQL)})
    FOR SHARE OF r),
  ${emissionInsert}
  SELECT t.connector, t.side_usage, (SELECT count(*)::int FROM inserted) AS n FROM target t`;

const sideUsageStatement = statement<{ runId: string }, { side_usage: Record<string, unknown> }>("model_call_side_usage")`
  SELECT side_usage FROM runs WHERE id = ${(p) => p.runId}::uuid`;

export function createModelCallRepository(db: Sql): SideCallLedger & RunLifecycle {
  return {
    async recordSideCall(call) {
      const [recorded] = await db.run(recordSideCallStatement, { call, usage: usageOfSideCall(call) });
      if (recorded === undefined) throw new Error(`run ${call.runId} vanished before its ${call.purpose} call was recorded`);
    },

    async recordTriage(runId: string, outcome: TriageOutcome, call: SideModelCall) {
      const triage = {
        runId,
        duration: outcome.triage.duration,
        shape: outcome.triage.shape,
        ackText: outcome.triage.ackText ?? null,
        fellBack: outcome.fellBack ?? null,
      };
      await db.transaction(async (trx) => {
        await trx.run(recordSideCallStatement, { call, usage: usageOfSideCall(call) });
        await trx.runLast(storeTriage, triage);
      });
    },

    async reserveAcks(runId: string, epoch: number, drafts: readonly EmissionDraft[]) {
      const [reserved] = await db.run(reserveAckRows, { runId, epoch, emissions: emissionRows(drafts) });
      if (reserved === undefined) return sideUsageOf(undefined);
      if (reserved.n > 0) db.notify("keel_emissions", reserved.connector);
      return sideUsageOf(reserved.side_usage);
    },

    async sideUsage(runId: string) {
      const [row] = await db.run(sideUsageStatement, { runId });
      return sideUsageOf(row?.side_usage);
    },
  };
}
