// Deterministic admission of a proposed WorkGraph (issue #14 item 3). Pure: no I/O, no clock,
// no randomness. Every rule runs and every broken one is reported, so a planner that retries
// sees all of its mistakes at once. The order of reasons is fixed:
//   1. structure: empty graph, duplicate keys (in proposal order), unknown edge endpoints (in
//      edge order), one cycle;
//   2. ceilings: node count, depth, parallelism, revisions, replans;
//   3. per node, in proposal order: tools, slice, join inputs, verify subject, consumed
//      artifact types, human gates before gated effects;
//   4. the budget, one reason per dimension in budget.ts's order.
// Rules that need a partial order (depth, parallelism, ancestry) are skipped while the edges
// form a cycle, which is reported; parallelism and verify-subject ancestry are also skipped past
// the node ceiling, whose reason already rejects, so a huge proposal never buys a quadratic
// computation.
import { mayAdvertise, type ToolFacts } from "./policy.js";
import {
  SLICE_DIMENSIONS,
  type AdmissionContext,
  type AdmissionRejection,
  type AdmissionVerdict,
  type AdmittedWorkNode,
  type BudgetSlice,
  type WorkGraphProposal,
  type WorkNodeProposal,
} from "./work-graph.js";
import { findCycle, longestPaths, pathTo, Reach, topologicalOrder, widestAntichain, type Successors } from "./work-graph-order.js";

interface Structure {
  /** Key → index of its first node. */
  readonly indexOf: ReadonlyMap<string, number>;
  readonly successors: Successors;
  /** Distinct inputs of each node, ascending. */
  readonly predecessors: Successors;
}

function structure(proposal: WorkGraphProposal, reasons: AdmissionRejection[]): Structure {
  const indexOf = new Map<string, number>();
  const reported = new Set<string>();
  proposal.nodes.forEach((node, i) => {
    if (!indexOf.has(node.key)) indexOf.set(node.key, i);
    else if (!reported.has(node.key)) {
      reported.add(node.key);
      reasons.push({ code: "duplicate_node", node: node.key });
    }
  });
  const n = proposal.nodes.length;
  const successors: number[][] = Array.from({ length: n }, () => []);
  proposal.edges.forEach((edge, i) => {
    const from = indexOf.get(edge.from);
    const to = indexOf.get(edge.to);
    if (from === undefined) reasons.push({ code: "unknown_endpoint", edge: i, from: edge.from, to: edge.to, missing: edge.from });
    if (to === undefined && edge.to !== edge.from) reasons.push({ code: "unknown_endpoint", edge: i, from: edge.from, to: edge.to, missing: edge.to });
    if (from !== undefined && to !== undefined) successors[from]!.push(to);
  });
  for (const list of successors) sortUnique(list);
  const predecessors: number[][] = Array.from({ length: n }, () => []);
  successors.forEach((list, u) => {
    for (const v of list) predecessors[v]!.push(u);
  });
  return { indexOf, successors, predecessors };
}

/** Sorts ascending and drops repeats, in place (a repeated edge is one edge). */
function sortUnique(list: number[]): void {
  if (list.length < 2) return;
  list.sort((a, b) => a - b);
  let kept = 1;
  for (let i = 1; i < list.length; i++) if (list[i] !== list[kept - 1]) list[kept++] = list[i]!;
  list.length = kept;
}

/** Checks a proposal against the root's ceilings, tools, policy and remaining budget. */
export function admitWorkGraph(proposal: WorkGraphProposal, context: AdmissionContext): AdmissionVerdict {
  const reasons: AdmissionRejection[] = [];
  const nodes = proposal.nodes;
  const n = nodes.length;
  const ceilings = context.ceilings;
  if (n === 0) reasons.push({ code: "empty_graph" });

  const { indexOf, successors, predecessors } = structure(proposal, reasons);
  const cycle = findCycle(successors);
  if (cycle !== undefined) reasons.push({ code: "cycle", nodes: cycle.map((i) => nodes[i]!.key) });

  if (n > ceilings.maxNodes) reasons.push({ code: "too_many_nodes", count: n, limit: ceilings.maxNodes });

  // The partial order, when there is one.
  const order = cycle === undefined ? topologicalOrder(successors) : undefined;
  const levels = order === undefined ? undefined : longestPaths(successors, order, () => 1);
  // Reachability costs n² bits: only within the node ceiling (whose own reason rejects beyond it).
  const reach = order === undefined || n > ceilings.maxNodes ? undefined : new Reach(successors, order);
  let depth = 0;
  let width = 0;
  if (levels !== undefined) {
    let deepest = -1;
    levels.total.forEach((level, i) => {
      if (level > depth) [depth, deepest] = [level, i];
    });
    if (depth > ceilings.maxDepth) {
      reasons.push({ code: "too_deep", depth, limit: ceilings.maxDepth, path: pathTo(levels, deepest).map((i) => nodes[i]!.key) });
    }
  }
  if (reach !== undefined) {
    // A human gate waits on a person and occupies no worker, so it does not count.
    width = widestAntichain(reach, nodes.map((node) => node.kind !== "human_gate"));
    if (width > ceilings.maxParallelism) reasons.push({ code: "too_parallel", width, limit: ceilings.maxParallelism });
  }

  const revisions = context.revisionsSoFar + (context.purpose === "revision" ? 1 : 0);
  const replans = context.replansSoFar + (context.purpose === "replan" ? 1 : 0);
  if (context.purpose === "revision" && revisions > ceilings.maxRevisions) {
    reasons.push({ code: "too_many_revisions", revisions, limit: ceilings.maxRevisions });
  }
  if (context.purpose === "replan" && replans > ceilings.maxReplans) {
    reasons.push({ code: "too_many_replans", replans, limit: ceilings.maxReplans });
  }

  const gateAbove = order === undefined ? undefined : gatesAbove(nodes, successors, order);
  const tools = new Map<string, ToolFacts>(context.effectiveTools.map((tool) => [tool.fullName, tool]));
  nodes.forEach((node, i) => {
    checkTools(node, tools, context, gateAbove?.[i], reasons);
    checkSlice(node, reasons);
    checkInputs(node, i, predecessors, nodes, indexOf, reach, reasons);
  });

  const committed = committedBudget(nodes, successors, order);
  for (const { dimension, field } of SLICE_DIMENSIONS) {
    if (committed[field] > context.remaining[field]) {
      reasons.push({ code: "budget_exceeded", dimension, requested: committed[field], remaining: context.remaining[field] });
    }
  }

  if (reasons.length > 0 || order === undefined || levels === undefined) return { admitted: false, reasons };
  const admitted = order.map((i): AdmittedWorkNode => {
    const node = nodes[i]!;
    return {
      key: node.key,
      kind: node.kind,
      objective: node.objective,
      tools: node.tools,
      budget: node.budget,
      needsWorkspace: node.needsWorkspace,
      consumes: node.consumes,
      produces: node.produces,
      subject: node.subject,
      dependsOn: predecessors[i]!.map((p) => nodes[p]!.key),
      level: levels.total[i]!,
    };
  });
  return { admitted: true, graph: { nodes: admitted, depth, width, committed, revisions, replans } };
}

/** Per node: whether a human_gate is among its ancestors. */
function gatesAbove(nodes: readonly WorkNodeProposal[], successors: Successors, order: readonly number[]): readonly boolean[] {
  const above = new Array<boolean>(nodes.length).fill(false);
  for (const u of order) {
    const passes = above[u]! || nodes[u]!.kind === "human_gate";
    if (passes) for (const v of successors[u]!) above[v] = true;
  }
  return above;
}

function checkTools(
  node: WorkNodeProposal,
  tools: ReadonlyMap<string, ToolFacts>,
  context: AdmissionContext,
  gated: boolean | undefined,
  reasons: AdmissionRejection[],
): void {
  if ((node.kind === "human_gate" || node.kind === "join") && node.tools.length > 0) {
    reasons.push({ code: "tools_on_control_node", node: node.key, kind: node.kind });
    return;
  }
  for (const name of new Set(node.tools)) {
    const facts = tools.get(name);
    if (facts === undefined) {
      reasons.push({ code: "tool_not_available", node: node.key, tool: name });
      continue;
    }
    // The effective list is already filtered by policy; asking again keeps a stale list honest.
    const decision = mayAdvertise(context.policy, facts);
    if (!decision.allowed) {
      reasons.push({ code: "tool_refused_by_policy", node: node.key, tool: name, reason: decision.reason });
      continue;
    }
    // `gated` is undefined while the edges form a cycle: ancestry means nothing then.
    if (gated === false && context.gatedEffects.includes(facts.effect)) {
      reasons.push({ code: "ungated_effect", node: node.key, tool: name, effect: facts.effect });
    }
  }
}

/**
 * A loop's first model call is refused when any dimension checked before a model call is at its
 * limit (domain/budget.ts), so a zero in any of them leaves the node unable to do anything.
 */
const LOOP_NEEDS: ReadonlySet<keyof BudgetSlice> = new Set<keyof BudgetSlice>([
  "maxWallClockMs",
  "maxIterations",
  "maxModelCalls",
  "maxInputTokens",
  "maxOutputTokens",
  "maxOutputBytes",
  "maxCostMicroUsd",
]);

function checkSlice(node: WorkNodeProposal, reasons: AdmissionRejection[]): void {
  for (const { dimension, field } of SLICE_DIMENSIONS) {
    const value = node.budget[field];
    if (!Number.isSafeInteger(value) || value < 0) reasons.push({ code: "invalid_slice", node: node.key, dimension, value });
    else if (value === 0 && node.kind === "agent_loop" && LOOP_NEEDS.has(field)) reasons.push({ code: "empty_slice", node: node.key, dimension });
  }
}

function checkInputs(
  node: WorkNodeProposal,
  i: number,
  predecessors: Successors,
  nodes: readonly WorkNodeProposal[],
  indexOf: ReadonlyMap<string, number>,
  reach: Reach | undefined,
  reasons: AdmissionRejection[],
): void {
  const inputs = predecessors[i]!;
  if (node.kind === "join" && inputs.length < 2) reasons.push({ code: "join_needs_inputs", node: node.key, inputs: inputs.length });
  if (node.kind === "verify") {
    const subject = node.subject === undefined ? undefined : indexOf.get(node.subject);
    if (node.subject === undefined) reasons.push({ code: "verify_without_subject", node: node.key });
    else if (subject === undefined) reasons.push({ code: "verify_subject_unknown", node: node.key, subject: node.subject });
    else if (reach !== undefined && !reach.has(subject, i)) reasons.push({ code: "verify_subject_not_upstream", node: node.key, subject: node.subject });
  }
  // Sources read what the root run hands them (the request, its workspace); other nodes read
  // only what their inputs emit, so a typo in an artifact type is caught before anything runs.
  if (inputs.length === 0) return;
  for (const type of new Set(node.consumes)) {
    if (!inputs.some((p) => nodes[p]!.produces.includes(type))) reasons.push({ code: "input_not_produced", node: node.key, artifactType: type });
  }
}

/**
 * What the slices commit of the root's budget: spend dimensions summed over all nodes; wall
 * clock summed along the longest path, since nodes on different branches spend the same minutes.
 * Invalid values count as 0 here (they are rejected on their own). With a cycle there is no
 * longest path, and wall clock is summed like the rest.
 */
function committedBudget(nodes: readonly WorkNodeProposal[], successors: Successors, order: readonly number[] | undefined): BudgetSlice {
  const valid = (value: number): number => (Number.isSafeInteger(value) && value > 0 ? value : 0);
  const sum = (field: keyof BudgetSlice): number => nodes.reduce((total, node) => total + valid(node.budget[field]), 0);
  let wallClock = sum("maxWallClockMs");
  if (order !== undefined) {
    const paths = longestPaths(successors, order, (i) => valid(nodes[i]!.budget.maxWallClockMs));
    wallClock = paths.total.reduce((most, value) => Math.max(most, value), 0);
  }
  return {
    maxWallClockMs: wallClock,
    maxIterations: sum("maxIterations"),
    maxModelCalls: sum("maxModelCalls"),
    maxToolCalls: sum("maxToolCalls"),
    maxInputTokens: sum("maxInputTokens"),
    maxOutputTokens: sum("maxOutputTokens"),
    maxOutputBytes: sum("maxOutputBytes"),
    maxCostMicroUsd: sum("maxCostMicroUsd"),
  };
}
