// What the driver tells the outside about its own work: spans for a tracing backend and how
// long each phase took, for the latency histograms. telemetry/ implements both; the driver
// sees only these two ports, and runs without either (unit tests, replay).
import type { ModelSpec } from "../domain/agent.js";
import type { ModelTurn } from "../domain/transcript.js";
import type { ToolResult } from "../tools/tool-registry.js";
import type { ClaimedRun, InvocationIntent } from "./run-store.js";

/** A phase of the loop whose latency /metrics reports. */
export type TimedPhase = "step" | "model_call" | "tool_call";

export interface PhaseLatencies {
  /** One finished phase; `label` is the provider of a model call and the tool of a tool call. */
  record(phase: TimedPhase, ms: number, label?: string): void;
}

/**
 * Spans around the loop's work. Each runs `work` with its span active, so the spans nest
 * run > step > model call / tool call and log lines written inside carry their ids. The
 * driver gets this port only when a tracer is configured and otherwise calls `work` itself:
 * without tracing, an iteration allocates nothing for it.
 */
export interface RunTracing {
  /** One claim of a run, from the claim to the moment this worker lets go of it. */
  claim(claimed: ClaimedRun, workerId: string, work: () => Promise<void>): Promise<void>;
  /** One iteration: its model call, the step's commit and its tool calls. */
  step<T extends { readonly kind: string }>(runId: string, stepIndex: number, work: () => Promise<T>): Promise<T>;
  modelCall(runId: string, spec: ModelSpec, work: () => Promise<ModelTurn>): Promise<ModelTurn>;
  toolCall(runId: string, intent: InvocationIntent, work: () => Promise<ToolResult>): Promise<ToolResult>;
}
