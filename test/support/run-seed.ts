// Rows a real run would have written, inserted straight into the ledger where a test needs a shape
// the scripted model does not produce (an exec's observations, an artifact, a run to own emissions).
import { randomUUID } from "node:crypto";
import type pg from "pg";
import type { EmissionTarget } from "../../control-plane/src/ledger/ledger-writes.js";
import { sql as sqlText, type Sql } from "../../control-plane/src/ledger/sql.js";

export interface SeededCall {
  readonly invocationId: string;
  readonly observationIds: readonly string[];
}

/** A tool call on a committed step, with its observations in order and, optionally, an artifact. */
export async function seedToolCall(
  db: pg.Client,
  call: { readonly runId: string; readonly stepId: string; readonly ordinal?: number; readonly observations: readonly string[]; readonly artifact?: boolean },
): Promise<SeededCall> {
  const invocationId = randomUUID();
  const ordinal = call.ordinal ?? 0;
  await db.query(
    `INSERT INTO tool_invocations (id, run_id, step_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status, result_text)
     VALUES ($1, $2, $3, $4, $5, 'exec', '1', 'read', '{}', 'succeeded', 'done')`,
    [invocationId, call.runId, call.stepId, `call_${ordinal}`, ordinal],
  );
  const observationIds: string[] = [];
  for (const [i, text] of call.observations.entries()) {
    const id = randomUUID();
    observationIds.push(id);
    await db.query("INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text) VALUES ($1, $2, $3, $4, 'stdout', $5)", [
      id,
      call.runId,
      invocationId,
      i + 1,
      text,
    ]);
  }
  if (call.artifact === true) {
    await db.query(
      "INSERT INTO artifacts (id, run_id, tool_invocation_id, type, schema_version, provenance, inline_data) VALUES ($1, $2, $3, 'patch', '1', 'test', 'diff')",
      [randomUUID(), call.runId, invocationId],
    );
  }
  // The call's result ("done") is its last observation, read from the call itself under the call's id.
  return { invocationId, observationIds: [...observationIds, invocationId] };
}

/**
 * A run, its conversation and its requesting actor, for emissions to belong to (the ledger's
 * foreign keys reject orphans): the target reserveEmissions writes for.
 */
export async function seedEmissionTarget(
  sql: Sql,
  connector: string,
  options: { readonly actor: string; readonly externalConversationId?: string; readonly status?: "succeeded" | "running" },
): Promise<EmissionTarget> {
  const target: EmissionTarget = {
    runId: randomUUID(),
    agentId: "demo",
    conversationId: randomUUID(),
    externalConversationId: options.externalConversationId ?? `${connector}-conversation`,
    connector,
  };
  await sql.query(sqlText`
    WITH actor AS (INSERT INTO actors (id) VALUES (${options.actor}) ON CONFLICT DO NOTHING),
    conversation AS (
      INSERT INTO conversations (id, agent_id, external_id, connector)
      VALUES (${target.conversationId}, ${target.agentId}, ${target.externalConversationId}, ${connector}))
    INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage)
    VALUES (${target.runId}, ${target.agentId}, ${target.conversationId}, ${connector}, ${options.status ?? "succeeded"}, ${options.actor}, '{}', '{}')`);
  return target;
}

/** An agent, an actor and one conversation of theirs: what a run row needs to point at. */
export async function seedConversation(db: pg.Client, ids: { readonly agent: string; readonly actor: string; readonly conversation: string }): Promise<void> {
  await db.query(
    `WITH agent AS (INSERT INTO agents (id, spec, revision) VALUES ($1, '{"policy": {}}', 1)),
       actor AS (INSERT INTO actors (id) VALUES ($2))
     INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($3::uuid, $1, $3::text, 'test')`,
    [ids.agent, ids.actor, ids.conversation],
  );
}

/** A running run held by worker `w` at epoch 1, as a claim leaves it. */
export async function seedHeldRun(db: pg.Client, ids: { readonly agent: string; readonly actor: string; readonly conversation: string }): Promise<string> {
  const runId = randomUUID();
  await db.query(
    `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_epoch, lease_expires_at)
     VALUES ($1, $2, $3, 'test', 'running', $4, '{}', '{}', 'w', 1, now() + interval '1 minute')`,
    [runId, ids.agent, ids.conversation, ids.actor],
  );
  return runId;
}
