// The ledger rows a benchmark's workspace and observations hang off (their foreign keys): an
// agent, an actor, a conversation and a running run (leased to the bench), then a step and a tool call per stream.
import { randomUUID } from "node:crypto";
import type pg from "pg";

const BENCH_WORKER = "sandbox-bench";

/** The lease the bench holds on its run: observations are fenced like every write. */
export const benchFence = (runId: string) => ({ runId, workerId: BENCH_WORKER, epoch: 1 });

export async function insertBenchRun(db: pg.Client): Promise<string> {
  const [runId, conversationId] = [randomUUID(), randomUUID()];
  await db.query(
    `WITH agent AS (INSERT INTO agents (id, spec, revision) VALUES ('sandbox-bench', '{}', 1) ON CONFLICT (id) DO NOTHING),
       actor AS (INSERT INTO actors (id) VALUES ('sandbox-bench') ON CONFLICT (id) DO NOTHING),
       conversation AS (INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($2, 'sandbox-bench', $3, 'bench'))
     INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_epoch, lease_expires_at)
     VALUES ($1, 'sandbox-bench', $2, 'bench', 'running', 'sandbox-bench', '{}', '{}', '${BENCH_WORKER}', 1, now() + interval '1 day')`,
    [runId, conversationId, `bench-${conversationId}`],
  );
  return runId;
}

/** A step holding one pending exec call of the run; returns the call's id. */
export async function insertBenchInvocation(db: pg.Client, runId: string, index: number): Promise<string> {
  const [stepId, invocationId] = [randomUUID(), randomUUID()];
  await db.query(
    `WITH step AS (INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at)
       VALUES ($2, $1, $4, 'replayable', 'running', 1, now()))
     INSERT INTO tool_invocations (id, run_id, step_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
     VALUES ($3, $1, $2, 'bench', 0, 'keel.exec', '1', 'read', '{}', 'pending')`,
    [runId, stepId, invocationId, index],
  );
  return invocationId;
}
