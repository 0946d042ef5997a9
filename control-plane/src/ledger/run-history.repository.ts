// A run's committed history as a resumed worker reads it: its steps with their calls, its
// artifacts, and the completed work of the runs it inherits from.
import { inheritablePrefix } from "../domain/interrupt.js";
import { FOLLOW_UP_PROGRESS_RECORDS, type TranscriptProgress } from "../domain/transcript-builder.js";
import type { ToolCallRequest } from "../domain/transcript.js";
import type { ConversationHistory, InvocationState, RunHistory, RunStore, StepState } from "../runner/run-store.js";
import { toArtifactRecord } from "./row-mapping.js";
import { ARTIFACT_COLUMNS, type ArtifactRow } from "./rows/ledger-rows.js";
import { fragment, optional, raw, statement, type Sql, type StatementFragment, type StatementPart } from "./sql.js";

const runId = (p: { readonly runId: string }) => p.runId;

const artifactsOfRun = statement<{ runId: string }, ArtifactRow>("history_artifacts")`
  SELECT ${raw(ARTIFACT_COLUMNS("a"))} FROM artifacts a WHERE a.run_id = ${runId}::uuid ORDER BY a.created_at`;

/**
 * The runs this one inherits from, oldest first, and whether each was continued or superseded, or
 * forked by an operator (then the step its heir starts after).
 */
const inheritanceChain = statement<{ runId: string }, { id: string; depth: number; continued: boolean; forked_at_step: number | null }>(
  "history_inheritance_chain",
)`
  WITH RECURSIVE chain(id, heir_id, depth) AS (
    SELECT r.inherits_from_run_id, r.id, 1 FROM runs r WHERE r.id = ${runId}::uuid AND r.inherits_from_run_id IS NOT NULL
    UNION ALL
    SELECT p.inherits_from_run_id, p.id, c.depth + 1 FROM chain c JOIN runs p ON p.id = c.id
    WHERE p.inherits_from_run_id IS NOT NULL AND c.depth < 64)
  SELECT c.id, c.depth, h.continuation_of_run_id IS NOT DISTINCT FROM c.id AS continued,
    CASE WHEN h.forked_from_run_id = c.id THEN h.forked_at_step END AS forked_at_step
  FROM chain c JOIN runs h ON h.id = c.heir_id ORDER BY c.depth DESC`;

/** The conversation's latest progress notices, newest first (text, created_at, seq), read from the end of its index. */
export function latestProgressSql<P>(conversationId: StatementPart<P>, exceptRunId?: (params: P) => string): StatementFragment<P> {
  const except = exceptRunId === undefined ? fragment<P>`` : fragment<P>` AND pe.run_id <> ${exceptRunId}::uuid`;
  return fragment<P>`SELECT pe.text, pe.created_at, pe.seq FROM progress_events pe
  WHERE pe.conversation_id = ${conversationId}::uuid${except}
  ORDER BY pe.created_at DESC, pe.seq DESC LIMIT ${raw(String(FOLLOW_UP_PROGRESS_RECORDS))}`;
}

/**
 * The latest progress notices of the conversation's runs created before this one (a follow-up,
 * a continuation or a supersession), newest first; this run's own notices are not history.
 */
const recentProgressOfConversation = statement<{ runId: string; conversationId: string }, { text: string; created_at: Date }>(
  "history_recent_progress_of_conversation",
  { plans: "generic" },
)`${latestProgressSql<{ runId: string; conversationId: string }>((p) => p.conversationId, runId)}`;

const recentProgress = statement<{ runId: string }, { text: string; created_at: Date }>("history_recent_progress")`
  SELECT pe.text, pe.created_at FROM runs r
  JOIN progress_events pe ON pe.conversation_id = r.conversation_id AND pe.run_id <> r.id
  JOIN runs earlier ON earlier.id = pe.run_id AND earlier.created_at <= r.created_at
  WHERE r.id = ${runId}::uuid
  ORDER BY pe.created_at DESC, pe.seq DESC LIMIT ${raw(String(FOLLOW_UP_PROGRESS_RECORDS))}`;

interface StepRow {
  id: string;
  index: number;
  replayability: StepState["replayability"];
  feedback: string | null;
  response_text: string | null;
  tool_calls: ToolCallRequest[] | null;
}

const stepsOfRun = statement<{ runId: string }, StepRow>("history_steps")`
  SELECT s.id, s.index, s.replayability, s.feedback, m.response_text, m.tool_calls FROM run_steps s
  LEFT JOIN model_calls m ON m.run_id = s.run_id AND m.step_id = s.id WHERE s.run_id = ${runId}::uuid ORDER BY s.index`;

interface InvocationRow {
  id: string;
  step_id: string | null;
  provider_call_id: string;
  tool_name: string;
  effect: InvocationState["effect"];
  arguments: unknown;
  status: InvocationState["status"];
  result_text: string | null;
  refusal_reason: string | null;
  resolved_outcome: "applied" | "not_applied" | null;
  resolved_by_actor_id: string | null;
  resolution_reason: string | null;
}

const invocationsOfRun = statement<{ runId: string }, InvocationRow>("history_invocations")`
  SELECT i.id, i.step_id, i.provider_call_id, i.tool_name, i.effect, i.arguments, i.status, i.result_text, i.refusal_reason,
    i.resolved_outcome, i.resolved_by_actor_id, i.resolution_reason
  FROM tool_invocations i WHERE i.run_id = ${runId}::uuid ORDER BY i.created_at, i.ordinal`;

/** Rows newest first (as latestProgressSql reads them) to notices oldest first. */
export const asProgress = (rows: readonly { text: string; created_at: Date | string }[]): TranscriptProgress[] =>
  rows.map((row): TranscriptProgress => ({ text: row.text, at: new Date(row.created_at) })).reverse();

export function createConversationHistory(sql: Sql): ConversationHistory {
  return {
    recentProgress: async (conversationId, exceptRunId) => asProgress(await sql.run(recentProgressOfConversation, { runId: exceptRunId, conversationId })),
  };
}

export function createRunHistoryRepository(sql: Sql): Pick<RunStore, "loadHistory"> {
  const recentProgressOf = async (id: string): Promise<TranscriptProgress[]> => asProgress(await sql.run(recentProgress, { runId: id }));
  return {
    async loadHistory(id): Promise<RunHistory> {
      const [steps, artifacts, chain, progress] = await Promise.all([
        stepsOf(sql, id),
        sql.run(artifactsOfRun, { runId: id }),
        sql.run(inheritanceChain, { runId: id }),
        recentProgressOf(id),
      ]);
      // Each ancestor passes on what it inherited plus the completed prefix of its own work.
      let inherited: StepState[] = [];
      for (const ancestor of chain) {
        // A fork keeps its source's settled work up to the chosen step, effects included, as a continuation does.
        const cap = ancestor.forked_at_step;
        const steps = (await stepsOf(sql, ancestor.id)).filter((step) => cap === null || step.index <= cap);
        const own = inheritablePrefix(steps, ancestor.continued || cap !== null ? "all_settled" : "replayable_only");
        // Provider call ids restart with every run; prefixed, inherited ones never collide with the heir's.
        inherited = [...inherited, ...own.map((step) => withCallPrefix(step, `inherited${ancestor.depth}_`))];
      }
      return { steps, artifacts: artifacts.map(toArtifactRecord), inherited, progress };
    },
  };
}

/** A run's committed steps with their model turns and tool calls, in order. */
export async function stepsOf(sql: Pick<Sql, "run">, id: string): Promise<StepState[]> {
  const [steps, invocations] = await Promise.all([sql.run(stepsOfRun, { runId: id }), sql.run(invocationsOfRun, { runId: id })]);
  return steps.map(
    (step): StepState => ({
      index: Number(step.index),
      replayability: step.replayability,
      responseText: step.response_text ?? "",
      toolCalls: step.tool_calls ?? [],
      feedback: step.feedback ?? undefined,
      invocations: invocations
        .filter((row) => row.step_id === step.id)
        .map(
          (row): InvocationState => ({
            id: row.id,
            providerCallId: row.provider_call_id,
            toolName: row.tool_name,
            effect: row.effect,
            argumentsJson: JSON.stringify(row.arguments),
            status: row.status,
            resultText: optional(row.result_text),
            refusalReason: optional(row.refusal_reason),
            resolvedOutcome: optional(row.resolved_outcome),
            resolvedByActorId: optional(row.resolved_by_actor_id),
            resolutionReason: optional(row.resolution_reason),
          }),
        ),
    }),
  );
}

function withCallPrefix(step: StepState, prefix: string): StepState {
  return {
    ...step,
    toolCalls: step.toolCalls.map((call) => ({ ...call, id: `${prefix}${call.id}` })),
    invocations: step.invocations.map((invocation) => ({ ...invocation, providerCallId: `${prefix}${invocation.providerCallId}` })),
  };
}
