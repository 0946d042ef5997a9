import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { DEFAULT_GRAPH_CEILINGS, type Policy, type RunBudget } from "./agent.js";
import { admitWorkGraph } from "./graph-admission.js";
import type { ToolFacts } from "./policy.js";
import {
  describeRejection,
  SLICE_DIMENSIONS,
  WORK_NODE_KINDS,
  type AdmissionContext,
  type AdmissionRejection,
  type AdmissionVerdict,
  type BudgetSlice,
  type WorkEdge,
  type WorkGraphProposal,
  type WorkNodeProposal,
} from "./work-graph.js";

const EFFECTIVE: readonly ToolFacts[] = [
  { fullName: "repo.read.v1", effect: "read" },
  { fullName: "repo.write.v1", effect: "write" },
  { fullName: "sandbox.exec.v1", effect: "write" },
];

const SLICE: BudgetSlice = {
  maxWallClockMs: 60_000,
  maxIterations: 5,
  maxModelCalls: 5,
  maxToolCalls: 10,
  maxInputTokens: 10_000,
  maxOutputTokens: 1_000,
  maxOutputBytes: 100_000,
  maxCostMicroUsd: 10_000,
};

const ROOT_LEFT: RunBudget = {
  maxWallClockMs: 600_000,
  maxIterations: 50,
  maxModelCalls: 50,
  maxToolCalls: 200,
  maxInputTokens: 1_000_000,
  maxOutputTokens: 100_000,
  maxOutputBytes: 10_000_000,
  maxCostMicroUsd: 1_000_000,
};

function node(key: string, over: Partial<WorkNodeProposal> = {}): WorkNodeProposal {
  return { key, kind: "agent_loop", objective: `do ${key}`, tools: [], budget: SLICE, needsWorkspace: false, consumes: [], produces: [], subject: undefined, ...over };
}

const control = (key: string, kind: "join" | "human_gate", over: Partial<WorkNodeProposal> = {}): WorkNodeProposal =>
  node(key, { kind, budget: { ...SLICE, maxIterations: 0, maxModelCalls: 0 }, ...over });

/** Roomier than the defaults, so each test trips only the rule it is about. */
const WIDE = { ...DEFAULT_GRAPH_CEILINGS, maxDepth: 6, maxParallelism: 8 };

function context(over: Partial<AdmissionContext> = {}): AdmissionContext {
  return {
    ceilings: WIDE,
    policy: { kind: "allow_all", networkAccess: false },
    effectiveTools: EFFECTIVE,
    gatedEffects: [],
    remaining: ROOT_LEFT,
    purpose: "initial",
    revisionsSoFar: 0,
    replansSoFar: 0,
    ...over,
  };
}

const edges = (...pairs: readonly string[]): WorkEdge[] =>
  pairs.map((pair) => {
    const [from = "", to = ""] = pair.split(">");
    return { from, to };
  });

function reasonsOf(verdict: AdmissionVerdict): readonly AdmissionRejection[] {
  return verdict.admitted ? [] : verdict.reasons;
}

describe("admitWorkGraph", () => {
  it("admits a fan-out/fan-in with a verifier, in a stable topological order", () => {
    const proposal: WorkGraphProposal = {
      nodes: [
        node("b", { tools: ["repo.read.v1"], produces: ["diff"], needsWorkspace: true }),
        node("a", { tools: ["repo.write.v1"], produces: ["diff"], needsWorkspace: true }),
        node("c", { produces: ["diff"] }),
        control("join", "join", { consumes: ["diff"], produces: ["diff"] }),
        node("check", { kind: "verify", subject: "join", consumes: ["diff"], produces: ["verdict"] }),
      ],
      edges: edges("a>join", "b>join", "c>join", "join>check", "a>join"),
    };
    const verdict = admitWorkGraph(proposal, context());
    if (!verdict.admitted) throw new Error(verdict.reasons.map(describeRejection).join("; "));
    const graph = verdict.graph;
    expect(graph.nodes.map((n) => n.key)).toEqual(["b", "a", "c", "join", "check"]);
    expect(graph.nodes[3]).toMatchObject({ key: "join", dependsOn: ["b", "a", "c"], level: 2 });
    expect(graph.nodes[4]).toMatchObject({ key: "check", dependsOn: ["join"], level: 3 });
    expect(graph).toMatchObject({ depth: 3, width: 3, revisions: 0, replans: 0 });
    // Spend adds up over the five nodes; wall clock only along the longest path (three nodes).
    expect(graph.committed.maxToolCalls).toBe(50);
    expect(graph.committed.maxModelCalls).toBe(4 * 5);
    expect(graph.committed.maxWallClockMs).toBe(3 * 60_000);
  });

  it("rejects each broken ceiling with its limit", () => {
    const ceilings = { maxNodes: 3, maxDepth: 2, maxParallelism: 2, maxRevisions: 1, maxReplans: 1 };
    const wide = { nodes: [node("a"), node("b"), node("c")], edges: [] };
    expect(reasonsOf(admitWorkGraph(wide, context({ ceilings })))).toEqual([{ code: "too_parallel", width: 3, limit: 2 }]);
    const deep = { nodes: [node("a"), node("b"), node("c")], edges: edges("a>b", "b>c") };
    expect(reasonsOf(admitWorkGraph(deep, context({ ceilings })))).toEqual([{ code: "too_deep", depth: 3, limit: 2, path: ["a", "b", "c"] }]);
    const many = { nodes: [node("a"), node("b"), node("c"), node("d")], edges: edges("a>b", "c>d") };
    expect(reasonsOf(admitWorkGraph(many, context({ ceilings })))).toEqual([{ code: "too_many_nodes", count: 4, limit: 3 }]);
    // Past the node ceiling the quadratic rules are not computed: the count alone rejects.
    const crowd = { nodes: ["a", "b", "c", "d", "e", "f"].map((key) => node(key)), edges: [] };
    expect(reasonsOf(admitWorkGraph(crowd, context({ ceilings })))).toEqual([{ code: "too_many_nodes", count: 6, limit: 3 }]);
    const one = { nodes: [node("a")], edges: [] };
    expect(reasonsOf(admitWorkGraph(one, context({ ceilings, purpose: "revision", revisionsSoFar: 1 })))).toEqual([
      { code: "too_many_revisions", revisions: 2, limit: 1 },
    ]);
    expect(reasonsOf(admitWorkGraph(one, context({ ceilings, purpose: "replan", replansSoFar: 1 })))).toEqual([
      { code: "too_many_replans", replans: 2, limit: 1 },
    ]);
    expect(admitWorkGraph(one, context({ ceilings, purpose: "replan", revisionsSoFar: 5 })).admitted).toBe(true);
  });

  it("does not count waiting human gates against parallelism", () => {
    const ceilings = { ...DEFAULT_GRAPH_CEILINGS, maxParallelism: 1 };
    const proposal = { nodes: [control("gate", "human_gate"), node("work")], edges: [] };
    expect(admitWorkGraph(proposal, context({ ceilings })).admitted).toBe(true);
  });

  it("reports one cycle, duplicates and unknown endpoints", () => {
    const proposal = {
      nodes: [node("a"), node("b"), node("c"), node("a")],
      edges: edges("a>b", "b>c", "c>b", "c>ghost", "x>x"),
    };
    expect(reasonsOf(admitWorkGraph(proposal, context()))).toEqual([
      { code: "duplicate_node", node: "a" },
      { code: "unknown_endpoint", edge: 3, from: "c", to: "ghost", missing: "ghost" },
      { code: "unknown_endpoint", edge: 4, from: "x", to: "x", missing: "x" },
      { code: "cycle", nodes: ["b", "c"] },
    ]);
    expect(reasonsOf(admitWorkGraph({ nodes: [], edges: [] }, context()))).toEqual([{ code: "empty_graph" }]);
  });

  it("refuses tools the root lacks, tools the policy refuses, and tools on control nodes", () => {
    const policy: Policy = { kind: "restriction", allowedTools: [], allowedEffects: ["read"], pathRules: [], networkAccess: false };
    const proposal = {
      nodes: [
        node("a", { tools: ["repo.read.v1", "mail.send.v1", "repo.write.v1"] }),
        control("gate", "human_gate", { tools: ["repo.read.v1"] }),
      ],
      edges: edges("a>gate"),
    };
    const reasons = reasonsOf(admitWorkGraph(proposal, context({ policy })));
    expect(reasons.map((r) => r.code)).toEqual(["tool_not_available", "tool_refused_by_policy", "tools_on_control_node"]);
    expect(reasons[0]).toEqual({ code: "tool_not_available", node: "a", tool: "mail.send.v1" });
    expect(reasons[1]).toMatchObject({ node: "a", tool: "repo.write.v1" });
  });

  it("needs a human gate upstream of every gated effect", () => {
    const gatedEffects = ["write"] as const;
    const ungated = { nodes: [node("plan"), node("ship", { tools: ["repo.read.v1", "sandbox.exec.v1"] })], edges: edges("plan>ship") };
    expect(reasonsOf(admitWorkGraph(ungated, context({ gatedEffects })))).toEqual([
      { code: "ungated_effect", node: "ship", tool: "sandbox.exec.v1", effect: "write" },
    ]);
    expect(admitWorkGraph(ungated, context()).admitted).toBe(true);
    const gated = {
      nodes: [node("plan"), control("approve", "human_gate"), node("ship", { tools: ["sandbox.exec.v1"] })],
      edges: edges("plan>approve", "approve>ship"),
    };
    expect(admitWorkGraph(gated, context({ gatedEffects })).admitted).toBe(true);
  });

  it("checks joins, verifiers and the artifact types nodes consume", () => {
    const proposal = {
      nodes: [
        node("a", { produces: ["diff"] }),
        control("j", "join"),
        node("v1", { kind: "verify" }),
        node("v2", { kind: "verify", subject: "nope" }),
        node("v3", { kind: "verify", subject: "b" }),
        node("b", { consumes: ["diff", "log"] }),
      ],
      edges: edges("a>j", "a>v3", "a>b"),
    };
    expect(reasonsOf(admitWorkGraph(proposal, context()))).toEqual([
      { code: "join_needs_inputs", node: "j", inputs: 1 },
      { code: "verify_without_subject", node: "v1" },
      { code: "verify_subject_unknown", node: "v2", subject: "nope" },
      { code: "verify_subject_not_upstream", node: "v3", subject: "b" },
      { code: "input_not_produced", node: "b", artifactType: "log" },
    ]);
  });

  it("refuses invalid and empty slices", () => {
    const proposal = {
      nodes: [node("a", { budget: { ...SLICE, maxModelCalls: 0, maxCostMicroUsd: -1 } }), node("b", { budget: { ...SLICE, maxToolCalls: 1.5 } })],
      edges: [],
    };
    expect(reasonsOf(admitWorkGraph(proposal, context()))).toEqual([
      { code: "empty_slice", node: "a", dimension: "model_calls" },
      { code: "invalid_slice", node: "a", dimension: "cost", value: -1 },
      { code: "invalid_slice", node: "b", dimension: "tool_calls", value: 1.5 },
    ]);
  });

  it("never lets six slices spend more than the root has left", () => {
    const six = { nodes: ["a", "b", "c", "d", "e", "f"].map((key) => node(key)), edges: [] };
    const remaining = { ...ROOT_LEFT, maxModelCalls: 29, maxCostMicroUsd: 60_000 };
    expect(reasonsOf(admitWorkGraph(six, context({ remaining })))).toEqual([
      { code: "budget_exceeded", dimension: "model_calls", requested: 30, remaining: 29 },
    ]);
    // Six parallel nodes of a minute each fit in two minutes of wall clock; a chain of six does not.
    const shortClock = { ...ROOT_LEFT, maxWallClockMs: 120_000 };
    expect(admitWorkGraph(six, context({ remaining: shortClock })).admitted).toBe(true);
    const chain = { ...six, edges: edges("a>b", "b>c", "c>d", "d>e", "e>f") };
    expect(reasonsOf(admitWorkGraph(chain, context({ remaining: shortClock })))).toEqual([
      { code: "budget_exceeded", dimension: "wall_clock", requested: 360_000, remaining: 120_000 },
    ]);
  });

  it("collects every reason, in the documented order, with a readable line each", () => {
    const ceilings = { ...WIDE, maxNodes: 2 };
    const proposal = {
      nodes: [node("a", { tools: ["nope.v1"] }), node("b"), node("b")],
      edges: edges("a>b", "b>a"),
    };
    const reasons = reasonsOf(admitWorkGraph(proposal, context({ ceilings, remaining: { ...ROOT_LEFT, maxIterations: 1 } })));
    expect(reasons.map((r) => r.code)).toEqual(["duplicate_node", "cycle", "too_many_nodes", "tool_not_available", "budget_exceeded"]);
    expect(reasons.map(describeRejection)).toContain("the edges form a cycle: a -> b -> a");
  });
});

// --- Properties -------------------------------------------------------------------------

const KEYS = ["n0", "n1", "n2", "n3", "n4", "n5", "n6"];
const TOOL_POOL = ["repo.read.v1", "repo.write.v1", "sandbox.exec.v1", "mail.send.v1"];
const TYPES = ["diff", "log", "report"];

const sliceArb = fc.record<BudgetSlice>(
  Object.fromEntries(SLICE_DIMENSIONS.map(({ field }) => [field, fc.nat(20)])) as { [K in keyof BudgetSlice]: fc.Arbitrary<number> },
);

const nodeArb = (key: string): fc.Arbitrary<WorkNodeProposal> =>
  fc.record({
    key: fc.constant(key),
    kind: fc.constantFrom(...WORK_NODE_KINDS),
    objective: fc.constant(`do ${key}`),
    tools: fc.subarray(TOOL_POOL),
    budget: sliceArb,
    needsWorkspace: fc.boolean(),
    consumes: fc.subarray(TYPES),
    produces: fc.subarray(TYPES),
    subject: fc.option(fc.constantFrom(...KEYS), { nil: undefined }),
  });

const proposalArb: fc.Arbitrary<WorkGraphProposal> = fc.integer({ min: 1, max: KEYS.length }).chain((n) =>
  fc.record({
    nodes: fc.tuple(...KEYS.slice(0, n).map(nodeArb)),
    edges: fc.array(fc.record({ from: fc.constantFrom(...KEYS.slice(0, n)), to: fc.constantFrom(...KEYS.slice(0, n)) }), { maxLength: 12 }),
  }),
);

const contextArb: fc.Arbitrary<AdmissionContext> = fc.record({
  ceilings: fc.record({ maxNodes: fc.integer({ min: 1, max: 8 }), maxDepth: fc.integer({ min: 1, max: 8 }), maxParallelism: fc.integer({ min: 1, max: 8 }), maxRevisions: fc.nat(3), maxReplans: fc.nat(3) }),
  policy: fc.constantFrom<Policy>(
    { kind: "allow_all", networkAccess: false },
    { kind: "restriction", allowedTools: [], allowedEffects: ["read"], pathRules: [], networkAccess: false },
  ),
  effectiveTools: fc.constant(EFFECTIVE),
  gatedEffects: fc.subarray(["read", "write"] as const),
  remaining: fc.record<RunBudget>(Object.fromEntries(SLICE_DIMENSIONS.map(({ field }) => [field, fc.nat(120)])) as { [K in keyof RunBudget]: fc.Arbitrary<number> }),
  purpose: fc.constantFrom("initial" as const, "revision" as const, "replan" as const),
  revisionsSoFar: fc.nat(3),
  replansSoFar: fc.nat(3),
});

/**
 * Near-valid proposals, so the properties about admitted graphs are not vacuous: edges point
 * forward in proposal order except for a rare back edge, control nodes carry no tools, verifiers
 * check an earlier node, and the context is roomy but not always roomy enough.
 */
const plausibleArb: fc.Arbitrary<[WorkGraphProposal, AdmissionContext]> = fc.integer({ min: 1, max: KEYS.length }).chain((n) =>
  fc
    .tuple(
      fc.array(
        fc.record({
          kind: fc.oneof({ arbitrary: fc.constant("agent_loop" as const), weight: 6 }, fc.constantFrom("verify" as const, "join" as const, "human_gate" as const)),
          tools: fc.subarray(EFFECTIVE.map((t) => t.fullName)),
          budget: fc.record<BudgetSlice>(
            Object.fromEntries(SLICE_DIMENSIONS.map(({ field }) => [field, fc.integer({ min: 1, max: 20 })])) as { [K in keyof BudgetSlice]: fc.Arbitrary<number> },
          ),
          produces: fc.subarray(TYPES),
          subject: fc.nat(KEYS.length),
        }),
        { minLength: n, maxLength: n },
      ),
      fc.array(fc.tuple(fc.nat(n - 1), fc.nat(n - 1)), { maxLength: 2 * n }),
      fc.option(fc.tuple(fc.nat(n - 1), fc.nat(n - 1)), { freq: 10 }),
      contextArb,
      fc.integer({ min: 60, max: 200 }),
      fc.boolean(),
      fc.record({ maxNodes: fc.integer({ min: 4, max: 8 }), maxDepth: fc.integer({ min: 3, max: 8 }), maxParallelism: fc.integer({ min: 3, max: 8 }), maxRevisions: fc.constant(1), maxReplans: fc.constant(1) }),
    )
    .map(([drafts, pairs, backEdge, ctx, room, ungated, roomy]): [WorkGraphProposal, AdmissionContext] => {
      const nodes = drafts.map((d, i): WorkNodeProposal => {
        const control = d.kind === "join" || d.kind === "human_gate";
        const subject = d.kind === "verify" && i > 0 ? KEYS[d.subject % i] : undefined;
        return { ...node(KEYS[i]!), kind: d.kind, tools: control ? [] : d.tools, budget: d.budget, produces: d.produces, subject };
      });
      const forward = pairs.filter(([a, b]) => a !== b).map(([a, b]) => ({ from: KEYS[Math.min(a, b)]!, to: KEYS[Math.max(a, b)]! }));
      const checked = nodes.flatMap((n) => (n.subject === undefined ? [] : [{ from: n.subject, to: n.key }]));
      const extra = backEdge === null ? [] : [{ from: KEYS[Math.max(...backEdge)]!, to: KEYS[Math.min(...backEdge)]! }];
      const remaining = Object.fromEntries(SLICE_DIMENSIONS.map(({ field }) => [field, room])) as unknown as RunBudget;
      return [{ nodes, edges: [...forward, ...checked, ...extra] }, { ...ctx, ceilings: roomy, gatedEffects: ungated ? [] : ctx.gatedEffects, policy: { kind: "allow_all", networkAccess: false }, purpose: "initial", remaining }];
    }),
);

const anyArb = fc.oneof(fc.tuple(proposalArb, contextArb), plausibleArb);

/** Independent of the code under test: a graph is acyclic when sources can be peeled off until none is left. */
function acyclic(proposal: WorkGraphProposal): boolean {
  let left = new Set(proposal.nodes.map((n) => n.key));
  for (;;) {
    const sources = [...left].filter((key) => !proposal.edges.some((e) => e.to === key && left.has(e.from)));
    if (sources.length === 0) return left.size === 0;
    left = new Set([...left].filter((key) => !sources.includes(key)));
  }
}

/** Every path's total wall-clock slice, by brute-force walking (small graphs only). */
function longestClock(proposal: WorkGraphProposal): number {
  const clock = new Map(proposal.nodes.map((n) => [n.key, n.budget.maxWallClockMs]));
  const walk = (key: string): number =>
    (clock.get(key) ?? 0) + Math.max(0, ...proposal.edges.filter((e) => e.from === key).map((e) => walk(e.to)));
  return Math.max(0, ...proposal.nodes.map((n) => walk(n.key)));
}

describe("admission properties", () => {
  it("draws enough admissible proposals for the properties to mean something", () => {
    const admitted = fc.sample(plausibleArb, { numRuns: 1_000, seed: 14 }).filter(([p, c]) => admitWorkGraph(p, c).admitted).length;
    expect(admitted).toBeGreaterThan(150);
  });

  it("never accepts a cycle, and an admitted order respects every edge", () => {
    fc.assert(
      fc.property(anyArb, ([proposal, ctx]) => {
        const verdict = admitWorkGraph(proposal, ctx);
        if (!acyclic(proposal)) {
          expect(reasonsOf(verdict).some((r) => r.code === "cycle")).toBe(true);
          return;
        }
        expect(reasonsOf(verdict).some((r) => r.code === "cycle")).toBe(false);
        if (!verdict.admitted) return;
        const position = new Map(verdict.graph.nodes.map((n, i) => [n.key, i]));
        for (const edge of proposal.edges) expect(position.get(edge.from)!).toBeLessThan(position.get(edge.to)!);
      }),
      { numRuns: 500 },
    );
  });

  it("accepted slices never sum past the remaining budget in any dimension", () => {
    fc.assert(
      fc.property(anyArb, ([proposal, ctx]) => {
        const verdict = admitWorkGraph(proposal, ctx);
        if (!verdict.admitted) return;
        for (const { field } of SLICE_DIMENSIONS) {
          if (field === "maxWallClockMs") continue;
          const total = proposal.nodes.reduce((sum, n) => sum + n.budget[field], 0);
          expect(total).toBeLessThanOrEqual(ctx.remaining[field]);
        }
        expect(longestClock(proposal)).toBeLessThanOrEqual(ctx.remaining.maxWallClockMs);
      }),
      { numRuns: 1_000 },
    );
  });

  it("an admitted graph keeps every ceiling and uses only the root's tools", () => {
    const effective = new Set(EFFECTIVE.map((t) => t.fullName));
    fc.assert(
      fc.property(anyArb, ([proposal, ctx]) => {
        const verdict = admitWorkGraph(proposal, ctx);
        if (!verdict.admitted) return;
        const { graph } = verdict;
        expect(graph.nodes.length).toBeLessThanOrEqual(ctx.ceilings.maxNodes);
        expect(graph.depth).toBeLessThanOrEqual(ctx.ceilings.maxDepth);
        expect(graph.width).toBeLessThanOrEqual(ctx.ceilings.maxParallelism);
        expect(graph.revisions).toBeLessThanOrEqual(Math.max(ctx.ceilings.maxRevisions, ctx.revisionsSoFar));
        for (const n of graph.nodes) for (const tool of n.tools) expect(effective.has(tool)).toBe(true);
      }),
      { numRuns: 500 },
    );
  });

  it("lists reasons by group (structure, ceilings, nodes in proposal order, budget)", () => {
    const group: Record<AdmissionRejection["code"], number> = {
      empty_graph: 0,
      duplicate_node: 0,
      unknown_endpoint: 0,
      cycle: 0,
      too_many_nodes: 1,
      too_deep: 1,
      too_parallel: 1,
      too_many_revisions: 1,
      too_many_replans: 1,
      tool_not_available: 2,
      tool_refused_by_policy: 2,
      tools_on_control_node: 2,
      invalid_slice: 2,
      empty_slice: 2,
      ungated_effect: 2,
      join_needs_inputs: 2,
      verify_without_subject: 2,
      verify_subject_unknown: 2,
      verify_subject_not_upstream: 2,
      input_not_produced: 2,
      budget_exceeded: 3,
    };
    fc.assert(
      fc.property(anyArb, ([proposal, ctx]) => {
        const reasons = reasonsOf(admitWorkGraph(proposal, ctx));
        const rank = (r: AdmissionRejection): number => {
          if (group[r.code] !== 2 || !("node" in r)) return 0;
          return proposal.nodes.findIndex((n) => n.key === r.node);
        };
        for (let i = 1; i < reasons.length; i++) {
          const [before, after] = [reasons[i - 1]!, reasons[i]!];
          expect(group[before.code]).toBeLessThanOrEqual(group[after.code]);
          if (group[before.code] === 2 && group[after.code] === 2) expect(rank(before)).toBeLessThanOrEqual(rank(after));
        }
      }),
      { numRuns: 500 },
    );
  });

  it("the same proposal gives the same verdict and the same reasons in the same order", () => {
    fc.assert(
      fc.property(anyArb, ([proposal, ctx]) => {
        const first = admitWorkGraph(proposal, ctx);
        const again = admitWorkGraph(structuredClone(proposal), structuredClone(ctx));
        expect(again).toEqual(first);
        if (!first.admitted) expect(first.reasons.length).toBeGreaterThan(0);
      }),
      { numRuns: 500 },
    );
  });
});
