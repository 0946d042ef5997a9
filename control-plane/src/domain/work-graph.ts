// WorkGraph planning in domain terms (issue #14): what the primary model proposes, what
// admission needs to judge it, and the graph admission hands to the scheduler. The model only
// proposes; graph-admission.ts decides, and nothing here is scheduled until it says yes.
import type { GraphCeilings, Policy, RunBudget, ToolEffect } from "./agent.js";
import type { BudgetDimension, RunUsage } from "./run.js";
import type { ToolFacts } from "./policy.js";

export const WORK_NODE_KINDS = ["agent_loop", "verify", "join", "human_gate"] as const;
export type WorkNodeKind = (typeof WORK_NODE_KINDS)[number];

/**
 * The share of the root's aggregate budget one node may spend, in the root budget's own
 * dimensions. Spend dimensions of all nodes add up against what the root has left; wall clock
 * does not (parallel nodes share the same minutes), so it adds up along each path instead.
 */
export type BudgetSlice = RunBudget;

export const ZERO_SLICE: BudgetSlice = {
  maxWallClockMs: 0,
  maxIterations: 0,
  maxModelCalls: 0,
  maxToolCalls: 0,
  maxInputTokens: 0,
  maxOutputTokens: 0,
  maxOutputBytes: 0,
  maxCostMicroUsd: 0,
};

/** The dimensions in budget.ts's fixed order, with the slice field each one reads. */
export const SLICE_DIMENSIONS: readonly { readonly dimension: BudgetDimension; readonly field: keyof BudgetSlice }[] = [
  { dimension: "wall_clock", field: "maxWallClockMs" },
  { dimension: "iterations", field: "maxIterations" },
  { dimension: "model_calls", field: "maxModelCalls" },
  { dimension: "tool_calls", field: "maxToolCalls" },
  { dimension: "input_tokens", field: "maxInputTokens" },
  { dimension: "output_tokens", field: "maxOutputTokens" },
  { dimension: "output_bytes", field: "maxOutputBytes" },
  { dimension: "cost", field: "maxCostMicroUsd" },
];

export interface WorkNodeProposal {
  /** Unique within the proposal; edges and verify subjects name nodes by it (WorkNode.key). */
  readonly key: string;
  readonly kind: WorkNodeKind;
  readonly objective: string;
  /** Full tool names ("ns.name.vN"), each of which the root must be able to use itself. */
  readonly tools: readonly string[];
  readonly budget: BudgetSlice;
  readonly needsWorkspace: boolean;
  /** Artifact types the node reads from its inputs, and the types it emits to its dependants. */
  readonly consumes: readonly string[];
  readonly produces: readonly string[];
  /** verify only: the key of the node whose output it checks. */
  readonly subject: string | undefined;
}

/** `to` runs after `from` and receives its artifacts. */
export interface WorkEdge {
  readonly from: string;
  readonly to: string;
}

export interface WorkGraphProposal {
  readonly nodes: readonly WorkNodeProposal[];
  readonly edges: readonly WorkEdge[];
}

/**
 * Why the graph is being (re)planned. A revision reshapes pending work (a worker asked for more
 * decomposition, or a refinement arrived); a replan follows a failed verification. Each has its
 * own ceiling, and together they are the graph's starvation bound.
 */
export type ProposalPurpose = "initial" | "revision" | "replan";

/** Everything admission weighs besides the proposal; the caller reads it from the ledger. */
export interface AdmissionContext {
  readonly ceilings: GraphCeilings;
  readonly policy: Policy;
  /** The root run's effective tools (granted, reachable on its connector, allowed by policy). */
  readonly effectiveTools: readonly ToolFacts[];
  /**
   * Effects that need a human_gate upstream: a node whose tool subset includes a tool with one
   * of these effects must have a human_gate among its ancestors. Empty means no gating.
   */
  readonly gatedEffects: readonly ToolEffect[];
  /** What the root run has left in each dimension (see remainingBudget). */
  readonly remaining: RunBudget;
  readonly purpose: ProposalPurpose;
  /** Revisions and replans already admitted for this root run. */
  readonly revisionsSoFar: number;
  readonly replansSoFar: number;
}

export interface AdmittedWorkNode extends WorkNodeProposal {
  /** Distinct input keys, in proposal order. */
  readonly dependsOn: readonly string[];
  /** Longest path from a source, in nodes: sources are level 1. */
  readonly level: number;
}

export interface AdmittedWorkGraph {
  /** A topological order; among ready nodes, proposal order breaks ties. */
  readonly nodes: readonly AdmittedWorkNode[];
  /** Nodes on the longest path. */
  readonly depth: number;
  /** The most executing nodes (all but human gates) that could run at once: the widest antichain. */
  readonly width: number;
  /** Spend dimensions summed over nodes; wall clock is the longest path's sum. */
  readonly committed: BudgetSlice;
  readonly revisions: number;
  readonly replans: number;
}

/** Each rejection names what broke and the limit it broke; graph-admission.ts lists them in a fixed order. */
export type AdmissionRejection =
  | { readonly code: "empty_graph" }
  | { readonly code: "duplicate_node"; readonly node: string }
  | { readonly code: "unknown_endpoint"; readonly edge: number; readonly from: string; readonly to: string; readonly missing: string }
  | { readonly code: "cycle"; readonly nodes: readonly string[] }
  | { readonly code: "too_many_nodes"; readonly count: number; readonly limit: number }
  | { readonly code: "too_deep"; readonly depth: number; readonly limit: number; readonly path: readonly string[] }
  | { readonly code: "too_parallel"; readonly width: number; readonly limit: number }
  | { readonly code: "too_many_revisions"; readonly revisions: number; readonly limit: number }
  | { readonly code: "too_many_replans"; readonly replans: number; readonly limit: number }
  | { readonly code: "tool_not_available"; readonly node: string; readonly tool: string }
  | { readonly code: "tool_refused_by_policy"; readonly node: string; readonly tool: string; readonly reason: string }
  | { readonly code: "tools_on_control_node"; readonly node: string; readonly kind: WorkNodeKind }
  | { readonly code: "invalid_slice"; readonly node: string; readonly dimension: BudgetDimension; readonly value: number }
  | { readonly code: "empty_slice"; readonly node: string; readonly dimension: BudgetDimension }
  | { readonly code: "budget_exceeded"; readonly dimension: BudgetDimension; readonly requested: number; readonly remaining: number }
  | { readonly code: "ungated_effect"; readonly node: string; readonly tool: string; readonly effect: ToolEffect }
  | { readonly code: "join_needs_inputs"; readonly node: string; readonly inputs: number }
  | { readonly code: "verify_without_subject"; readonly node: string }
  | { readonly code: "verify_subject_unknown"; readonly node: string; readonly subject: string }
  | { readonly code: "verify_subject_not_upstream"; readonly node: string; readonly subject: string }
  | { readonly code: "input_not_produced"; readonly node: string; readonly artifactType: string };

export type AdmissionVerdict =
  | { readonly admitted: true; readonly graph: AdmittedWorkGraph }
  | { readonly admitted: false; readonly reasons: readonly AdmissionRejection[] };

/** What the root has left: its budget less its usage (and elapsed time), never below zero. */
export function remainingBudget(budget: RunBudget, usage: RunUsage, elapsedMs: number): RunBudget {
  const left = (limit: number, used: number): number => Math.max(0, limit - used);
  return {
    maxWallClockMs: left(budget.maxWallClockMs, elapsedMs),
    maxIterations: left(budget.maxIterations, usage.iterations),
    maxModelCalls: left(budget.maxModelCalls, usage.modelCalls),
    maxToolCalls: left(budget.maxToolCalls, usage.toolCalls),
    maxInputTokens: left(budget.maxInputTokens, usage.inputTokens),
    maxOutputTokens: left(budget.maxOutputTokens, usage.outputTokens),
    maxOutputBytes: left(budget.maxOutputBytes, usage.outputBytes),
    maxCostMicroUsd: left(budget.maxCostMicroUsd, usage.costMicroUsd),
  };
}

/** One line per rejection, for the run's events and the model's retry prompt. */
export function describeRejection(reason: AdmissionRejection): string {
  switch (reason.code) {
    case "empty_graph":
      return "the proposal has no nodes";
    case "duplicate_node":
      return `node key "${reason.node}" is used more than once`;
    case "unknown_endpoint":
      return `edge ${reason.edge} (${reason.from} -> ${reason.to}) names no node "${reason.missing}"`;
    case "cycle":
      return `the edges form a cycle: ${[...reason.nodes, reason.nodes[0] ?? ""].join(" -> ")}`;
    case "too_many_nodes":
      return `${reason.count} nodes exceed the node ceiling of ${reason.limit}`;
    case "too_deep":
      return `the longest path has ${reason.depth} nodes (${reason.path.join(" -> ")}), over the depth ceiling of ${reason.limit}`;
    case "too_parallel":
      return `up to ${reason.width} nodes could run at once, over the parallelism ceiling of ${reason.limit}`;
    case "too_many_revisions":
      return `this would be revision ${reason.revisions}, over the revision ceiling of ${reason.limit}`;
    case "too_many_replans":
      return `this would be replan ${reason.replans}, over the replan ceiling of ${reason.limit}`;
    case "tool_not_available":
      return `node "${reason.node}" asks for tool "${reason.tool}", which the root run cannot use`;
    case "tool_refused_by_policy":
      return `node "${reason.node}" asks for tool "${reason.tool}", which the policy refuses: ${reason.reason}`;
    case "tools_on_control_node":
      return `node "${reason.node}" is a ${reason.kind} node and may name no tools`;
    case "invalid_slice":
      return `node "${reason.node}" has a ${reason.dimension} slice of ${reason.value}; slices are whole numbers >= 0`;
    case "empty_slice":
      return `node "${reason.node}" runs a loop but its ${reason.dimension} slice is 0`;
    case "budget_exceeded":
      return `the slices ask for ${reason.requested} ${reason.dimension}, but the root run has ${reason.remaining} left`;
    case "ungated_effect":
      return `node "${reason.node}" may use ${reason.effect} tool "${reason.tool}" with no human_gate before it`;
    case "join_needs_inputs":
      return `join node "${reason.node}" has ${reason.inputs} input(s); a join needs at least 2`;
    case "verify_without_subject":
      return `verify node "${reason.node}" names no subject`;
    case "verify_subject_unknown":
      return `verify node "${reason.node}" checks "${reason.subject}", which is not a node`;
    case "verify_subject_not_upstream":
      return `verify node "${reason.node}" checks "${reason.subject}", which does not run before it`;
    case "input_not_produced":
      return `node "${reason.node}" consumes "${reason.artifactType}", which none of its inputs produces`;
  }
}
