// first-slice's baseline: the rows Keel writes for one message, written by one raw transaction of
// plain statements, timed one at a time and spread over as many connections as Keel has messages
// in flight.
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import pg from "pg";
import { DEMO_AGENT } from "../../control-plane/src/fixtures/demo-agent.js";
import { ZERO_USAGE } from "../../control-plane/src/domain/run.js";
import { SUCCEEDED_ACK, WORKING_ACK } from "../../control-plane/src/domain/settlement.js";
import { beginRaw, ms, summarize, type Durability } from "../support.js";

export interface RawOptions {
  /** Connections the throughput floor spreads its transactions over. */
  readonly concurrency: number;
  /** Untimed transactions before the timed ones. */
  readonly warmup: number;
  /** Timed transactions. */
  readonly raw: number;
  readonly durability: Durability;
}

const RAW_CONNECTOR = "bench-raw";

const RUN_BUDGET = JSON.stringify(DEMO_AGENT.budget);
const ZERO_USAGE_JSON = JSON.stringify(ZERO_USAGE);

/** Each of `raw` raw transactions, one after another on one connection, after `warmup` untimed: their latencies in ms. */
export async function rawLatencies(db: pg.Client, options: RawOptions, progressEvery: number, progress: (line: string) => void): Promise<number[]> {
  for (let i = 0; i < options.warmup; i++) await rawTransaction(db, `warmup-${i}`, i, options.durability);
  const latencies: number[] = [];
  for (let i = 0; i < options.raw; i++) {
    const started = performance.now();
    await rawTransaction(db, `raw-${i}`, i, options.durability);
    latencies.push(performance.now() - started);
    if ((i + 1) % progressEvery === 0 || i + 1 === options.raw) {
      const recent = summarize(latencies.slice(-progressEvery));
      progress(`raw txn ${i + 1}/${options.raw}; last ${Math.min(progressEvery, latencies.length)}: p50 ${ms(recent.p50)} ms, p99 ${ms(recent.p99)} ms`);
    }
  }
  return latencies;
}

/** `concurrency` connections for the throughput floor: each pass spreads its transactions over them. */
export async function openRawClients(url: string, options: RawOptions): Promise<{ pass(label: string, count: number): Promise<number>; close(): Promise<void> }> {
  const clients = await Promise.all(
    Array.from({ length: options.concurrency }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      return client;
    }),
  );
  return {
    /** `count` raw transactions over the connections; their rate per second. */
    async pass(label, count) {
      let next = 0;
      const began = performance.now();
      await Promise.all(
        clients.map(async (client) => {
          for (let i = next++; i < count; i = next++) await rawTransaction(client, `${label}-${i}`, i, options.durability);
        }),
      );
      return count / ((performance.now() - began) / 1000);
    },
    close: async () => {
      await Promise.all(clients.map((client) => client.end()));
    },
  };
}

/**
 * What Keel writes for one message across its three transactions (ingress, claim, step
 * commit), as one transaction of plain statements with no reads, locks or notifications:
 * a floor, not a re-implementation.
 */
async function rawTransaction(db: pg.Client, key: string, i: number, durability: Durability): Promise<void> {
  const actorId = `raw-user-${i % 50}`;
  const runId = randomUUID();
  const messageRowId = randomUUID();
  const stepId = randomUUID();
  const externalMessageId = `${key}-message`;
  const text = `benchmark message ${key}`;
  const reply = `Hello from Keel. You said: ${text}`;
  const addressed = JSON.stringify([actorId]);
  const usage = JSON.stringify({ iterations: 1, modelCalls: 1, toolCalls: 0, inputTokens: 12, outputTokens: 12, outputBytes: reply.length, costMicroUsd: 0, wallClockMs: 1 });
  const request = JSON.stringify({ messages: [{ role: "system", content: DEMO_AGENT.systemPrompt }, { role: "user", content: text, actorId }], tools: [] });

  await beginRaw(db, durability);
  try {
    await db.query(
      `INSERT INTO actors (id, display_name) VALUES ($1, $2)
       ON CONFLICT (id) DO UPDATE SET display_name = EXCLUDED.display_name
       WHERE EXCLUDED.display_name <> '' AND actors.display_name <> EXCLUDED.display_name`,
      [actorId, "Raw User"],
    );
    const conversation = await db.query<{ id: string }>(
      `INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, $4)
       ON CONFLICT (agent_id, external_id) DO UPDATE SET connector = conversations.connector RETURNING id`,
      [randomUUID(), DEMO_AGENT.id, `${key}-conversation`, RAW_CONNECTOR],
    );
    const conversationId = conversation.rows[0]!.id;
    await db.query(
      `INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($1, $2, $3, $4, $5, $6)`,
      [messageRowId, conversationId, externalMessageId, actorId, text, runId],
    );
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage, event_seq)
       VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7::jsonb, $8::jsonb, 1)`,
      [runId, DEMO_AGENT.id, conversationId, RAW_CONNECTOR, actorId, externalMessageId, RUN_BUDGET, ZERO_USAGE_JSON],
    );
    await db.query(`INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) VALUES ($1, $2, $3, $4)`, [
      runId,
      messageRowId,
      actorId,
      externalMessageId,
    ]);
    await db.query(`INSERT INTO run_events (run_id, seq, kind, status, summary) VALUES ($1, 1, 'created', 'queued', $2)`, [
      runId,
      `message ${externalMessageId} from ${actorId}`,
    ]);
    await db.query(
      `INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id, external_conversation_id,
         reply_to_message_id, text, ack_state, addressed_actor_ids)
       VALUES ($1, $2, $3, 'ack', $4, $5, $6, $7, $8, $9, 'working', $10::jsonb)`,
      [randomUUID(), `ack:${runId}:working`, RAW_CONNECTOR, runId, DEMO_AGENT.id, conversationId, `${key}-conversation`, externalMessageId, WORKING_ACK, addressed],
    );
    // The step commit: the step with its model call, the run's terminal state, events, reply and ack.
    await db.query(
      `INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, actor_id, lease_epoch, started_at, event_seq, event_summary,
         call_id, call_role, call_provider, call_model, call_request, call_response_text, call_tool_calls, call_input_tokens,
         call_output_tokens, call_latency_ms, call_finish_reason, call_cost_micro_usd)
       VALUES ($1, $2, 0, 'replayable', 'succeeded', $3, 1, now(), 3, 'step 0: replied',
         $4, 'primary', 'scripted', 'scripted-demo', $5::jsonb, $6, '[]'::jsonb, 12, 12, 0, 'stop', 0)`,
      [stepId, runId, actorId, randomUUID(), request, reply],
    );
    await db.query(
      `UPDATE runs SET status = 'succeeded', usage = $2::jsonb, step_count = step_count + 1, final_reply = $3, event_seq = 4,
         lease_owner = NULL, lease_epoch = 1, lease_expires_at = NULL, started_at = now(), finished_at = now(), updated_at = now()
       WHERE id = $1`,
      [runId, usage, reply],
    );
    await db.query(
      `INSERT INTO run_events (run_id, seq, kind, status, summary) VALUES
         ($1, 2, 'status_changed', 'running', 'claimed'),
         ($1, 4, 'status_changed', 'succeeded', 'replied')`,
      [runId],
    );
    await db.query(
      `INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id, external_conversation_id,
         reply_to_message_id, text, ack_state, addressed_actor_ids)
       VALUES ($1, $2, $3, 'reply', $4, $5, $6, $7, $8, $9, NULL, $10::jsonb),
              ($11, $12, $3, 'ack', $4, $5, $6, $7, $8, $13, 'succeeded', $10::jsonb)`,
      [
        randomUUID(),
        `reply:${runId}`,
        RAW_CONNECTOR,
        runId,
        DEMO_AGENT.id,
        conversationId,
        `${key}-conversation`,
        externalMessageId,
        reply,
        addressed,
        randomUUID(),
        `ack:${runId}:settled`,
        SUCCEEDED_ACK,
      ],
    );
    await db.query("COMMIT");
  } catch (error) {
    await db.query("ROLLBACK").catch(() => {});
    throw error;
  }
}

