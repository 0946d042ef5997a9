// A run's triggers as the runner reads them: shared by the claim (which returns them with the
// lease) and by loadTriggers (which reads them again after an amendment).
import type { RunInputMessage, RunStore } from "../runner/run-store.js";
import { raw, statement, type Sql } from "./sql.js";

export interface TriggerRow {
  message_id: string;
  actor_id: string;
  text: string;
  relation: string;
  after_step: number;
  inherited: boolean;
}

/** The triggers of run `runId` (an SQL expression) as input messages, in arrival order. */
export const triggersSql = (runId: string): string => `SELECT json_agg(json_build_object('message_id', t.external_message_id, 'actor_id', t.actor_id, 'text', m.text,
    'relation', t.relation, 'after_step', t.after_step, 'inherited', t.inherited) ORDER BY t.inherited DESC, t.ordinal, t.received_at)
  FROM run_triggers t JOIN messages m ON m.id = t.message_id WHERE t.run_id = ${runId} AND t.relation <> 'cancels'`;

export function toInputMessages(rows: readonly TriggerRow[] | null): RunInputMessage[] {
  return (rows ?? []).map((m) => ({
    messageId: m.message_id,
    actorId: m.actor_id,
    text: m.text,
    relation: m.relation,
    afterStep: Number(m.after_step),
    inherited: Boolean(m.inherited),
  }));
}

const triggersOfRun = statement<{ runId: string }, { messages: TriggerRow[] | null; trigger_count: number }>("run_triggers")`
  SELECT (${raw(triggersSql("r.id"))}) AS messages, r.trigger_count FROM runs r WHERE r.id = ${(p) => p.runId}::uuid`;

export function loadTriggers(sql: Sql): RunStore["loadTriggers"] {
  return async (runId) => {
    const [row] = await sql.run(triggersOfRun, { runId });
    return { messages: toInputMessages(row?.messages ?? null), triggerCount: Number(row?.trigger_count ?? 0) };
  };
}
