// Triage of a root run by the fast model: how long the work looks and what shape it has, plus the
// copy of a message-shaped notice to stash for later. It is an optimization only: the reaction
// acks do not depend on it, and every failure of the classifier degrades to the defaults.
import type { AgentSpec } from "./agent.js";
import type { RunUsage } from "./run.js";

export type TriageDuration = "long" | "trivial" | "default";
export type TriageShape = "loop" | "graph_candidate";

export interface Triage {
  readonly duration: TriageDuration;
  /** graph_candidate only nominates the request for planning; it never makes the run a graph. */
  readonly shape: TriageShape;
  /** A short notice to post when the progress deadline fires, written in the same call. */
  readonly ackText: string | undefined;
}

/** What a slow, failing, absent or off-schema classifier leaves: the mechanism as if it did not exist. */
export const DEFAULT_TRIAGE: Triage = { duration: "default", shape: "loop", ackText: undefined };

/** The bound on the classifier: past it the run keeps its defaults; the run itself never waits. */
export const TRIAGE_TIMEOUT_MS = 5_000;

/** Ack copy is one short line: longer answers are cut, not trusted to be a notice. */
export const MAX_ACK_TEXT_CHARS = 280;

/** A triage as stored: the outcome, and why it is the default when the model did not give it. */
export interface TriageOutcome {
  readonly triage: Triage;
  readonly fellBack: string | undefined;
}

/** Specs are immutable once loaded, and one admission asks about the same spec more than once. */
const fastModelOf = new WeakMap<AgentSpec, boolean>();

/**
 * An agent without a fast model of its own: the spec falls back to the primary one, and triage is
 * not worth a call to the primary model (the mechanism is correct without it).
 */
export function hasFastModel(agent: AgentSpec): boolean {
  const known = fastModelOf.get(agent);
  if (known !== undefined) return known;
  const own = JSON.stringify(agent.models.fast) !== JSON.stringify(agent.models.primary);
  fastModelOf.set(agent, own);
  return own;
}

/** The triage of a run whose agent has no fast model: the defaults, decided at admission and stored with the run. */
export const NO_FAST_MODEL_TRIAGE: TriageOutcome = { triage: DEFAULT_TRIAGE, fellBack: "no fast model configured" };

/** The classifier's bound for a spec: its own timeout when shorter, never longer than the triage bound. */
export function triageTimeoutMs(specTimeoutMs: number): number {
  return specTimeoutMs > 0 ? Math.min(specTimeoutMs, TRIAGE_TIMEOUT_MS) : TRIAGE_TIMEOUT_MS;
}

/** The part of a run's usage a model call beside the loop adds (triage, classification, consent). */
export interface SideCallUsage {
  readonly modelCalls: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly costMicroUsd: number;
}

export const ZERO_SIDE_USAGE: SideCallUsage = { modelCalls: 0, inputTokens: 0, outputTokens: 0, costMicroUsd: 0 };

/** Reads side usage as stored (a JSON object whose keys may be missing). */
export function sideUsageOf(stored: Readonly<Record<string, unknown>> | undefined): SideCallUsage {
  const n = (key: keyof SideCallUsage): number => {
    const value = stored?.[key];
    return typeof value === "number" && Number.isFinite(value) ? value : 0;
  };
  return { modelCalls: n("modelCalls"), inputTokens: n("inputTokens"), outputTokens: n("outputTokens"), costMicroUsd: n("costMicroUsd") };
}

/**
 * The usage budgets are checked against: the loop's own plus the calls beside it. The two are
 * stored apart (a step commit writes the loop's usage whole) and only ever added here.
 */
export function withSideUsage(usage: RunUsage, side: SideCallUsage): RunUsage {
  return {
    ...usage,
    modelCalls: usage.modelCalls + side.modelCalls,
    inputTokens: usage.inputTokens + side.inputTokens,
    outputTokens: usage.outputTokens + side.outputTokens,
    costMicroUsd: usage.costMicroUsd + side.costMicroUsd,
  };
}

export type SideCallRole = "fast" | "decision";
export type SideCallPurpose = "triage" | "follow_up" | "consent" | "progress";

/** A fast- or decision-model call made beside the loop, as the ledger records it (no step). */
export interface SideModelCall {
  readonly id: string;
  readonly runId: string;
  readonly role: SideCallRole;
  readonly purpose: SideCallPurpose;
  readonly provider: string;
  readonly model: string;
  readonly request: unknown;
  readonly responseText: string;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly latencyMs: number;
  /** stop for an answer; otherwise why there is none (timeout, error, off_schema). */
  readonly finishReason: string;
  readonly costMicroUsd: number;
}

/** What a side call adds to its run's usage: one call, its tokens and its cost. */
export function usageOfSideCall(call: SideModelCall): SideCallUsage {
  return { modelCalls: 1, inputTokens: call.inputTokens, outputTokens: call.outputTokens, costMicroUsd: call.costMicroUsd };
}
