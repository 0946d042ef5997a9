import { describe, expect, it } from "vitest";
import { DEFAULT_GRAPH_CEILINGS } from "../domain/agent.js";
import { admitWorkGraph } from "../domain/graph-admission.js";
import { parseWorkGraphProposal, readWorkGraphProposal, WORK_GRAPH_PROPOSAL_LIMITS, workGraphProposalJsonSchema } from "./work-graph-proposal.js";

const loopBudget = { wall_clock_ms: 60_000, iterations: 4, model_calls: 4, tool_calls: 8, input_tokens: 20_000, output_tokens: 2_000 };

const answer = {
  nodes: [
    { key: "fix-a", kind: "agent_loop", objective: "Fix module a", tools: ["repo.write.v1"], budget: loopBudget, needs_workspace: true, produces: ["diff"] },
    { key: "fix-b", kind: "agent_loop", objective: "Fix module b", budget: loopBudget, needs_workspace: true, produces: ["diff"] },
    { key: "merge", kind: "join", objective: "Merge both diffs", consumes: ["diff"], produces: ["diff"] },
    { key: "check", kind: "verify", objective: "Run the tests", subject: "merge", consumes: ["diff"] },
  ],
  edges: [
    { from: "fix-a", to: "merge" },
    { from: "fix-b", to: "merge" },
    { from: "merge", to: "check" },
  ],
};

describe("work graph proposal schema", () => {
  it("turns the model's answer into the domain proposal, with defaults filled in", () => {
    const parsed = parseWorkGraphProposal(answer);
    if (!parsed.ok) throw new Error(parsed.problems.join("; "));
    const [fixA, fixB, merge, check] = parsed.proposal.nodes;
    expect(fixA).toEqual({
      key: "fix-a",
      kind: "agent_loop",
      objective: "Fix module a",
      tools: ["repo.write.v1"],
      budget: {
        maxWallClockMs: 60_000,
        maxIterations: 4,
        maxModelCalls: 4,
        maxToolCalls: 8,
        maxInputTokens: 20_000,
        maxOutputTokens: 2_000,
        maxOutputBytes: 0,
        maxCostMicroUsd: 0,
      },
      needsWorkspace: true,
      consumes: [],
      produces: ["diff"],
      subject: undefined,
    });
    expect(fixB?.tools).toEqual([]);
    expect(merge).toMatchObject({ kind: "join", needsWorkspace: false, budget: { maxModelCalls: 0 } });
    expect(check).toMatchObject({ kind: "verify", subject: "merge" });
    expect(parsed.proposal.edges).toEqual(answer.edges);
  });

  it("hands a parsed proposal to admission, which judges it", () => {
    const parsed = parseWorkGraphProposal(answer);
    if (!parsed.ok) throw new Error(parsed.problems.join("; "));
    // A loop's slice needs every dimension a model call checks (bytes and cost included), or it could not run.
    const nodes = parsed.proposal.nodes.map((n) => (n.kind === "agent_loop" ? { ...n, budget: { ...n.budget, maxOutputBytes: 100, maxCostMicroUsd: 100 } } : n));
    const verdict = admitWorkGraph({ ...parsed.proposal, nodes }, {
      ceilings: DEFAULT_GRAPH_CEILINGS,
      policy: { kind: "allow_all", networkAccess: false },
      effectiveTools: [{ fullName: "repo.write.v1", effect: "write" }],
      gatedEffects: ["write"],
      remaining: {
        maxWallClockMs: 600_000,
        maxIterations: 50,
        maxModelCalls: 50,
        maxToolCalls: 50,
        maxInputTokens: 100_000,
        maxOutputTokens: 10_000,
        maxOutputBytes: 1_000,
        maxCostMicroUsd: 1_000,
      },
      purpose: "initial",
      revisionsSoFar: 0,
      replansSoFar: 0,
    });
    // Well-formed is not admissible: the write tool has no human gate before it.
    expect(verdict).toEqual({ admitted: false, reasons: [{ code: "ungated_effect", node: "fix-a", tool: "repo.write.v1", effect: "write" }] });
  });

  it("names the field of every problem, and refuses unknown fields", () => {
    const bad = {
      nodes: [
        { key: "a", kind: "loop", objective: "" },
        { key: "-b", kind: "agent_loop", objective: "x", budget: { iterations: -1 }, extra: true },
      ],
      edges: [{ from: "a" }],
    };
    const parsed = parseWorkGraphProposal(bad);
    expect(parsed.ok).toBe(false);
    const problems = parsed.ok ? [] : parsed.problems;
    for (const path of ["nodes.0.kind", "nodes.0.objective", "nodes.1.key", "nodes.1.budget.iterations", "nodes.1", "edges.0.to"]) {
      expect(problems.some((p) => p.startsWith(`${path}:`))).toBe(true);
    }
  });

  it("refuses a proposal past its size bounds before admission sees it", () => {
    const node = { key: "n", kind: "agent_loop", objective: "x" };
    const tooMany = { nodes: Array.from({ length: WORK_GRAPH_PROPOSAL_LIMITS.nodes + 1 }, (_, i) => ({ ...node, key: `n${i}` })) };
    const parsed = parseWorkGraphProposal(tooMany);
    expect(parsed).toEqual({ ok: false, problems: [expect.stringMatching(/^nodes: /)] });
    expect(parseWorkGraphProposal({ nodes: [] }).ok).toBe(false);
    expect(parseWorkGraphProposal({ nodes: [{ ...node, objective: "x".repeat(WORK_GRAPH_PROPOSAL_LIMITS.objectiveChars + 1) }] }).ok).toBe(false);
  });

  it("reads a proposal out of model text, tolerating a fence", () => {
    expect(readWorkGraphProposal("```json\n" + JSON.stringify(answer) + "\n```").ok).toBe(true);
    expect(readWorkGraphProposal("no plan")).toEqual({ ok: false, problems: ["the answer holds no JSON object"] });
    expect(readWorkGraphProposal("{nodes:").ok).toBe(false);
  });

  it("advertises the same schema as JSON Schema, defaults optional", () => {
    const schema = workGraphProposalJsonSchema();
    expect(schema["$schema"]).toBeUndefined();
    expect(schema).toMatchObject({ type: "object", required: ["nodes"], additionalProperties: false });
    const nodes = (schema["properties"] as Record<string, { items: Record<string, unknown>; maxItems: number }>)["nodes"]!;
    expect(nodes.maxItems).toBe(WORK_GRAPH_PROPOSAL_LIMITS.nodes);
    expect(nodes.items).toMatchObject({
      required: ["key", "kind", "objective"],
      additionalProperties: false,
      properties: { kind: { enum: ["agent_loop", "verify", "join", "human_gate"] } },
    });
    expect(JSON.parse(JSON.stringify(schema))).toEqual(schema);
  });
});
