// Run lifecycle in domain terms. String values match the proto enum names, lowercased.

export const RUN_STATUSES = [
  "queued",
  "running",
  "awaiting_tool",
  "awaiting_input",
  "succeeded",
  "failed",
  "cancelled",
  "budget_exhausted",
  "waiting",
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

const TERMINAL: ReadonlySet<RunStatus> = new Set(["succeeded", "failed", "cancelled", "budget_exhausted"]);

export function isTerminal(status: RunStatus): boolean {
  return TERMINAL.has(status);
}

/** Not finished: a root run in one of these, once started, is its conversation's run in flight. */
export const LIVE_STATUSES = ["queued", "running", "awaiting_tool", "awaiting_input", "waiting"] as const satisfies readonly RunStatus[];

/** Live, with no worker holding the run: a stop applies at once. */
export const PARKED_STATUSES = ["queued", "awaiting_input", "waiting"] as const satisfies readonly RunStatus[];

/** A worker holds the run: these count against the concurrency ceilings, and their leases can expire. */
export const EXECUTING_STATUSES = ["running", "awaiting_tool"] as const satisfies readonly RunStatus[];

export type WaitReason =
  | "unknown_write_outcome"
  | "concurrency_ceiling"
  | "conversation_busy"
  | "coalescing"
  | "paused"
  | "human_gate"
  | "awaiting_children";

export type CommitBoundary = "buffering" | "committed";
export type Replayability = "replayable" | "not_replayable";
export type ExecutionShape = "loop" | "graph";
export type ModelRole = "primary" | "fast" | "decision";

export type BudgetDimension =
  | "wall_clock"
  | "iterations"
  | "model_calls"
  | "tool_calls"
  | "input_tokens"
  | "output_tokens"
  | "output_bytes"
  | "cost";

export interface RunUsage {
  readonly iterations: number;
  readonly modelCalls: number;
  readonly toolCalls: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly outputBytes: number;
  readonly costMicroUsd: number;
  readonly wallClockMs: number;
}

export const ZERO_USAGE: RunUsage = {
  iterations: 0,
  modelCalls: 0,
  toolCalls: 0,
  inputTokens: 0,
  outputTokens: 0,
  outputBytes: 0,
  costMicroUsd: 0,
  wallClockMs: 0,
};

export type RunEventKind =
  | "created"
  | "status_changed"
  | "step_committed"
  | "tool_invoked"
  | "tool_settled"
  | "observation"
  | "emission"
  | "trigger_added";

/** Cost of a call in micro-USD, from per-million-token prices; rounds up so budgets never undercount. */
export function costMicroUsd(
  usage: { readonly inputTokens: number; readonly outputTokens: number },
  prices: { readonly inputMicroUsdPerMtok: number; readonly outputMicroUsdPerMtok: number },
): number {
  return Math.ceil(
    (usage.inputTokens * prices.inputMicroUsdPerMtok + usage.outputTokens * prices.outputMicroUsdPerMtok) / 1_000_000,
  );
}
