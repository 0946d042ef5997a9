// keel.propose_work_graph.v1 (issue #14 items 1-3): the primary model proposes a WorkGraph as the
// call's arguments; admission (pure, domain/graph-admission.ts) judges it against the agent's
// ceilings, the run's effective tools and what is left of its budget. A refusal is recorded as
// run events and returned as the call's result, so the model may try again; after a bounded
// number it is told to go on as a loop. An admitted graph is persisted with the run parked in one
// transaction, and the call stays pending until the graph ends (its result is the graph's).
import type { AgentSpec } from "../domain/agent.js";
import { admitWorkGraph } from "../domain/graph-admission.js";
import type { ToolFacts } from "../domain/policy.js";
import { describeRejection, remainingBudget } from "../domain/work-graph.js";
import { childSpecOverride } from "../domain/work-graph-child.js";
import { keptNodes } from "../domain/work-graph-revision.js";
import { parseWorkGraphProposal, workGraphProposalSchema } from "../models/work-graph-proposal.js";
import { defineTool, type ToolDefinition, type ToolRegistry, type ToolResult } from "../tools/tool-registry.js";
import type { WorkGraphLedger } from "./work-graph-ledger.js";

export const PROPOSE_WORK_GRAPH_TOOL = "keel.propose_work_graph.v1";

/** Refused proposals a run may make before it is told to go on as a loop: the replan ceiling, at least one. */
export function proposalAttempts(agent: AgentSpec): number {
  return Math.max(1, agent.graph.maxReplans);
}

export interface ProposeWorkGraphDeps {
  readonly ledger: WorkGraphLedger;
  /** The registry the tool is part of (built after it, hence a getter). */
  readonly tools: () => ToolRegistry;
  readonly now: () => Date;
  /** Called once an admitted graph is persisted: the scheduler looks at it (its first children are already queued). */
  readonly admitted?: (rootRunId: string) => void;
}

/** Built-in tools never go to a child: it has no conversation to ask or report to, and plans no graph. */
const BUILT_IN = "keel.";

function effectiveTools(registry: ToolRegistry, agent: AgentSpec, connector: string): ToolFacts[] {
  return registry
    .catalogFor(agent, connector)
    .filter((tool) => !tool.fullName.startsWith(BUILT_IN))
    .map((tool) => ({ fullName: tool.fullName, effect: typeof tool.definition.effect === "function" ? "write" : tool.definition.effect }));
}

export function createProposeWorkGraphTool(deps: ProposeWorkGraphDeps): ToolDefinition {
  const refuse = (text: string): ToolResult => ({ ok: false, text });
  return defineTool<Record<string, unknown>>({
    name: "keel.propose_work_graph",
    version: 1,
    description:
      "Propose splitting the task into a graph of parts that run as separate workers, in parallel where the edges allow: agent_loop nodes do work with a subset of your tools and a slice of your budget; a verify node checks another node's output and fails the graph unless it passes; a join node combines its inputs; a human_gate node waits for a person to approve before what follows it runs (a rejection ends the graph). Keel checks the proposal against your ceilings, tools and remaining budget; if it is refused you are told why and may try again or go on alone. If it is accepted, you get the results of the graph's final nodes as this call's result.",
    parameters: workGraphProposalSchema,
    effect: "read",
    async execute(args, context) {
      const parsed = parseWorkGraphProposal(args);
      if (!parsed.ok) return refuse(`The proposal does not match the schema: ${parsed.problems.join("; ")}`);
      const facts = await deps.ledger.proposerFacts(context.runId, PROPOSE_WORK_GRAPH_TOOL);
      if (facts === undefined) return refuse("The run is gone.");
      if (facts.isChild) return refuse("A part of a work graph cannot plan a graph of its own; do this part directly.");
      // A failed graph may be followed by a replan, within the agent's replan ceiling, and one a
      // refinement stopped by a revision that keeps what finished; one that succeeded (or is still
      // running) is answered from.
      const last = facts.lastGraph;
      const revising = last?.status === "revised";
      if (last !== undefined && !revising && last.status !== "failed" && last.status !== "cancelled") {
        return refuse("This run already ran a work graph that succeeded; answer from its results.");
      }
      const agent = context.agent;
      const attempts = proposalAttempts(agent);
      if (facts.rejectedSoFar >= attempts) {
        return refuse(`Planning is closed for this run after ${facts.rejectedSoFar} refused proposals: do the task yourself, step by step.`);
      }
      const proposal = parsed.proposal;
      const verdict = admitWorkGraph(proposal, {
        ceilings: agent.graph,
        policy: agent.policy,
        effectiveTools: effectiveTools(deps.tools(), agent, facts.connector),
        gatedEffects: agent.graph.requireGateBeforeWrites === true ? ["write"] : [],
        remaining: remainingBudget(agent.budget, facts.usage, Math.max(0, deps.now().getTime() - facts.startedAt.getTime())),
        purpose: last === undefined ? "initial" : revising ? "revision" : "replan",
        revisionsSoFar: last === undefined ? 0 : last.revision - last.replans,
        replansSoFar: last?.replans ?? 0,
      });
      if (!verdict.admitted) {
        const number = facts.rejectedSoFar + 1;
        const lines = verdict.reasons.map(describeRejection);
        const events = lines.map((line) => `work graph proposal ${number} refused: ${line}`);
        const last = number >= attempts;
        if (last) events.push(`planning gave up after ${number} refused proposal(s): the run continues as a loop`);
        await deps.ledger.recordEvents(context.runId, context.invocationId, events);
        const next = last
          ? "No more proposals will be accepted for this run: do the task yourself, step by step."
          : `You may propose a corrected graph (${attempts - number} more attempt(s)) or do the task yourself.`;
        return refuse(`The work graph was refused:\n${lines.map((line) => `- ${line}`).join("\n")}\n${next}`);
      }
      const graph = verdict.graph;
      const kept = revising ? keptNodes(last.finished, graph.nodes) : new Map<string, string>();
      const childSpecs = Object.fromEntries(graph.nodes.map((node) => [node.key, childSpecOverride(agent, node)]));
      const loops = graph.nodes.filter((node) => node.kind === "agent_loop").length;
      const admitted = await deps.ledger.admit({
        runId: context.runId,
        epoch: context.leaseEpoch ?? 0,
        invocationId: context.invocationId,
        graph,
        revision: last === undefined ? 0 : last.revision + 1,
        kept,
        childSpecs,
        summary: `${last === undefined ? "shape loop -> graph" : revising ? `revision ${graph.revisions} of ${agent.graph.maxRevisions}, ${kept.size} finished node(s) kept` : `replan ${graph.replans} of ${agent.graph.maxReplans}`}: admitted ${graph.nodes.length} nodes (${loops} child runs, depth ${graph.depth}, up to ${graph.width} at once); the run waits for them`,
      });
      if (!admitted) return refuse("The run's lease was lost before the graph could be admitted.");
      deps.admitted?.(context.runId);
      return { ok: true, text: "The work graph was admitted; its result follows when it ends.", parked: true };
    },
  });
}
