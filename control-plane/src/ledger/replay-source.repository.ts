// What `keel replay` reads of a recorded run: its input, its primary model turns in order, its
// tool calls with their recorded outcomes, how it ended, and its agent as defined now. SQL only;
// replay/ re-runs it. Nothing here writes.
import type { AgentSpec } from "../domain/agent.js";
import type { ToolInvocationStatus } from "../domain/records.js";
import type { BudgetDimension, RunStatus } from "../domain/run.js";
import type { ToolCallRequest } from "../domain/transcript.js";
import type { RunInputMessage } from "../runner/run-store.js";
import { toInputMessages, triggersSql, type TriggerRow } from "./run-triggers.js";
import { optional, raw, statement, type Sql } from "./sql.js";

export interface RecordedTurn {
  readonly stepIndex: number;
  readonly text: string;
  readonly toolCalls: readonly ToolCallRequest[];
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly finishReason: string;
}

export interface RecordedInvocation {
  readonly stepIndex: number;
  readonly ordinal: number;
  readonly providerCallId: string;
  readonly toolName: string;
  readonly argumentsJson: string;
  readonly status: ToolInvocationStatus;
  readonly resultText: string | undefined;
  readonly refusalReason: string | undefined;
  readonly exitCode: number | undefined;
}

export interface RecordedRun {
  readonly runId: string;
  readonly agentId: string;
  /** The connector whose tools the run was offered (a fork's: its source's). */
  readonly connector: string;
  readonly status: RunStatus;
  readonly exhaustedDimension: BudgetDimension | undefined;
  readonly finalReply: string | undefined;
  readonly stepCount: number;
  readonly messages: readonly RunInputMessage[];
  readonly turns: readonly RecordedTurn[];
  readonly invocations: readonly RecordedInvocation[];
  /** The agent as defined now (its policy, tools and budget): what the replay runs against. */
  readonly agent: AgentSpec | undefined;
}

interface RunRow {
  agent_id: string;
  connector: string;
  status: RunStatus;
  exhausted_dimension: BudgetDimension | null;
  final_reply: string | null;
  step_count: number;
  spec: AgentSpec | null;
  messages: TriggerRow[] | null;
}

const runOf = statement<{ runId: string }, RunRow>("replay_run")`
  SELECT r.agent_id, coalesce((SELECT f.connector FROM runs f WHERE f.id = r.forked_from_run_id), r.connector) AS connector,
    r.status, r.exhausted_dimension, r.final_reply, r.step_count, a.spec, (${raw(triggersSql("r.id"))}) AS messages
  FROM runs r LEFT JOIN agents a ON a.id = r.agent_id WHERE r.id = ${(p) => p.runId}::uuid`;

interface TurnRow {
  step_index: number;
  response_text: string;
  tool_calls: ToolCallRequest[] | null;
  input_tokens: number;
  output_tokens: number;
  finish_reason: string;
}

const turnsOf = statement<{ runId: string }, TurnRow>("replay_turns")`
  SELECT s.index AS step_index, m.response_text, m.tool_calls, m.input_tokens, m.output_tokens, m.finish_reason
  FROM model_calls m JOIN run_steps s ON s.id = m.step_id WHERE m.run_id = ${(p) => p.runId}::uuid ORDER BY s.index, m.created_at`;

interface InvocationRow {
  step_index: number;
  ordinal: number;
  provider_call_id: string;
  tool_name: string;
  arguments: unknown;
  status: ToolInvocationStatus;
  result_text: string | null;
  refusal_reason: string | null;
  exit_code: number | null;
}

const invocationsOf = statement<{ runId: string }, InvocationRow>("replay_invocations")`
  SELECT s.index AS step_index, i.ordinal, i.provider_call_id, i.tool_name, i.arguments, i.status, i.result_text, i.refusal_reason,
    i.exit_code
  FROM tool_invocations i JOIN run_steps s ON s.id = i.step_id WHERE i.run_id = ${(p) => p.runId}::uuid ORDER BY s.index, i.ordinal`;

const endedSince = statement<{ since: Date; limit: number }, { id: string }>("replay_runs_since")`
  SELECT r.id FROM runs r WHERE r.finished_at >= ${(p) => p.since}::timestamptz AND r.parent_run_id IS NULL
  ORDER BY r.finished_at, r.id LIMIT ${(p) => p.limit}`;

export interface ReplaySource {
  /** The recorded run, or undefined when there is no such run. */
  load(runId: string): Promise<RecordedRun | undefined>;
  /** Root runs that ended at or after `since`, oldest first. */
  endedSince(since: Date, limit: number): Promise<string[]>;
}

export function createReplaySource(sql: Sql): ReplaySource {
  return {
    async load(runId) {
      const [[run], turns, invocations] = await Promise.all([
        sql.run(runOf, { runId }),
        sql.run(turnsOf, { runId }),
        sql.run(invocationsOf, { runId }),
      ]);
      if (run === undefined) return undefined;
      return {
        runId,
        agentId: run.agent_id,
        connector: run.connector,
        status: run.status,
        exhaustedDimension: optional(run.exhausted_dimension),
        finalReply: optional(run.final_reply),
        stepCount: Number(run.step_count),
        messages: toInputMessages(run.messages),
        agent: run.spec ?? undefined,
        turns: turns.map((t) => ({
          stepIndex: Number(t.step_index),
          text: t.response_text,
          toolCalls: t.tool_calls ?? [],
          inputTokens: Number(t.input_tokens),
          outputTokens: Number(t.output_tokens),
          finishReason: t.finish_reason,
        })),
        invocations: invocations.map((i) => ({
          stepIndex: Number(i.step_index),
          ordinal: Number(i.ordinal),
          providerCallId: i.provider_call_id,
          toolName: i.tool_name,
          argumentsJson: JSON.stringify(i.arguments),
          status: i.status,
          resultText: optional(i.result_text),
          refusalReason: optional(i.refusal_reason),
          exitCode: optional(i.exit_code),
        })),
      };
    },
    async endedSince(since, limit) {
      return (await sql.run(endedSince, { since, limit })).map((row) => row.id);
    },
  };
}
