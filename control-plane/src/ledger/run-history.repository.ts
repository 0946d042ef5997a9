// A run's committed history as a resumed worker reads it: its steps with their calls, its
// artifacts, and the completed work of the runs it inherits from.
import { inheritablePrefix } from "../domain/interrupt.js";
import type { ToolCallRequest } from "../domain/transcript.js";
import type { InvocationState, RunHistory, RunStore, StepState } from "../runner/run-store.js";
import { toArtifactRecord } from "./row-mapping.js";
import { optional, rows, type Sql } from "./sql.js";

export function createRunHistoryRepository(sql: Sql): Pick<RunStore, "loadHistory"> {
  return {
    async loadHistory(runId): Promise<RunHistory> {
      const [steps, artifacts, chain] = await Promise.all([
        stepsOf(sql, runId),
        rows<Record<string, unknown>>(sql, "SELECT * FROM artifacts WHERE run_id = ? ORDER BY created_at", [runId]),
        // The runs this one inherits from, oldest first, and whether each was continued or superseded.
        rows<{ id: string; depth: number; continued: boolean }>(
          sql,
          `WITH RECURSIVE chain(id, heir_id, depth) AS (
             SELECT r.inherits_from_run_id, r.id, 1 FROM runs r WHERE r.id = ? AND r.inherits_from_run_id IS NOT NULL
             UNION ALL
             SELECT p.inherits_from_run_id, p.id, c.depth + 1 FROM chain c JOIN runs p ON p.id = c.id
             WHERE p.inherits_from_run_id IS NOT NULL AND c.depth < 64)
           SELECT c.id, c.depth, h.continuation_of_run_id IS NOT DISTINCT FROM c.id AS continued
           FROM chain c JOIN runs h ON h.id = c.heir_id ORDER BY c.depth DESC`,
          [runId],
        ),
      ]);
      // Each ancestor passes on what it inherited plus the completed prefix of its own work.
      let inherited: StepState[] = [];
      for (const ancestor of chain) {
        const own = inheritablePrefix(await stepsOf(sql, ancestor.id), ancestor.continued ? "all_settled" : "replayable_only");
        // Provider call ids restart with every run; prefixed, inherited ones never collide with the heir's.
        inherited = [...inherited, ...own.map((step) => withCallPrefix(step, `inherited${ancestor.depth}_`))];
      }
      return { steps, artifacts: artifacts.map(toArtifactRecord), inherited };
    },

  };
}

/** A run's committed steps with their model turns and tool calls, in order. */
async function stepsOf(sql: Sql, runId: string): Promise<StepState[]> {
  const [steps, invocations] = await Promise.all([
    rows<{ id: string; index: number; replayability: StepState["replayability"]; feedback: string | null; response_text: string | null; tool_calls: ToolCallRequest[] | null }>(
      sql,
      `SELECT s.id, s.index, s.replayability, s.feedback, m.response_text, m.tool_calls FROM run_steps s
       LEFT JOIN model_calls m ON m.step_id = s.id WHERE s.run_id = ? ORDER BY s.index`,
      [runId],
    ),
    rows<Record<string, unknown>>(sql, "SELECT * FROM tool_invocations WHERE run_id = ? ORDER BY created_at, ordinal", [runId]),
  ]);
  return steps.map(
    (step): StepState => ({
      index: Number(step.index),
      replayability: step.replayability,
      responseText: step.response_text ?? "",
      toolCalls: step.tool_calls ?? [],
      feedback: step.feedback ?? undefined,
      invocations: invocations
        .filter((row) => row["step_id"] === step.id)
        .map(
          (row): InvocationState => ({
            id: row["id"] as string,
            providerCallId: row["provider_call_id"] as string,
            toolName: row["tool_name"] as string,
            effect: row["effect"] as InvocationState["effect"],
            argumentsJson: JSON.stringify(row["arguments"]),
            status: row["status"] as InvocationState["status"],
            resultText: optional(row["result_text"] as string | null),
            refusalReason: optional(row["refusal_reason"] as string | null),
            resolvedOutcome: optional(row["resolved_outcome"] as InvocationState["resolvedOutcome"] | null),
            resolvedByActorId: optional(row["resolved_by_actor_id"] as string | null),
            resolutionReason: optional(row["resolution_reason"] as string | null),
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
