// What a node's child run is given (issue #14 item 4): the same agent, narrowed. Its tools are
// the node's subset, its policy never wider than the parent's, its budget the node's slice; its
// input is the node's objective and the outputs of its inputs. Pure, so the scheduler pass and
// its tests build the same thing.
import type { AgentSpec, Policy } from "./agent.js";
import type { AdmittedWorkNode } from "./work-graph.js";
import { combineOutputs } from "./work-graph-schedule.js";

/**
 * A tool name no registry holds. A restriction's empty allow-list means "no restriction", so a
 * node given no tools lists this one instead and is offered nothing (built-ins included: a child
 * has no conversation to ask or report to, and may not plan a graph of its own).
 */
export const NO_TOOLS = "keel.no_tools_for_this_node";

/** The keys of the agent spec a child run overrides, as the claim merges them over the agent's. */
export function childSpecOverride(agent: AgentSpec, node: AdmittedWorkNode): Record<string, unknown> {
  const parent = agent.policy;
  const policy: Policy = {
    kind: "restriction",
    allowedTools: node.tools.length > 0 ? [...node.tools] : [NO_TOOLS],
    allowedEffects: parent.kind === "restriction" ? [...parent.allowedEffects] : [],
    pathRules: parent.kind === "restriction" ? [...parent.pathRules] : [],
    networkAccess: parent.networkAccess,
  };
  return {
    tools: agent.tools.filter((grant) => node.tools.includes(grant.toolName)),
    policy,
    budget: node.budget,
  };
}

/** The child's one input message: its part of the work, with what its inputs produced. */
export function childInput(
  node: { readonly key: string; readonly objective: string },
  inputs: readonly { readonly key: string; readonly output: string | undefined }[],
  /** A verify node's subject: the node whose output it checks, and that output. */
  check?: { readonly key: string; readonly output: string | undefined },
): string {
  const lines = [
    `You are doing one part of a larger task: node "${node.key}" of a work graph. Reply with the result of this part only.`,
    "",
    `Objective: ${node.objective}`,
  ];
  if (check !== undefined) {
    lines.push(
      "",
      `You are checking the output of node "${check.key}" against the objective. Start your reply with PASS or FAIL on its own line, then say why.`,
      "",
      combineOutputs([check]),
    );
  }
  const others = check === undefined ? inputs : inputs.filter((input) => input.key !== check.key);
  if (others.length > 0) lines.push("", "What the nodes before this one produced:", combineOutputs(others));
  return lines.join("\n");
}

/** A verifier's reply judged: it passes only when it starts with PASS; FAIL or anything else fails it. */
export function verifierVerdict(reply: string): { readonly passed: boolean; readonly output: string } {
  const first = reply.trimStart().split(/\s/, 1)[0]?.replace(/[^A-Za-z]/g, "").toUpperCase() ?? "";
  if (first === "PASS") return { passed: true, output: reply };
  if (first === "FAIL") return { passed: false, output: reply };
  return { passed: false, output: `the verifier answered neither PASS nor FAIL: ${reply}` };
}

/** The proposing call's result when the graph ends: its outcome and what its final nodes produced. */
export function graphResult(
  outcome: "succeeded" | "failed" | "cancelled",
  nodes: readonly { readonly key: string; readonly status: string; readonly output: string | undefined }[],
  sinks: readonly string[],
  /** Replans this root has used and may use: a failed graph says whether another proposal may follow. */
  replan?: { readonly used: number; readonly limit: number },
): string {
  const done = nodes.filter((node) => node.status === "succeeded").length;
  const head = `The work graph ${outcome}: ${done} of ${nodes.length} nodes succeeded.`;
  const failed = nodes.filter((node) => node.status === "failed").map((node) => `node "${node.key}" failed: ${node.output ?? "no detail"}`);
  const finals = nodes.filter((node) => sinks.includes(node.key) && node.status === "succeeded");
  const parts = [head, ...failed];
  if (finals.length > 0) parts.push("Results of its final nodes:", combineOutputs(finals));
  parts.push(
    outcome === "failed" && replan !== undefined && replan.used < replan.limit
      ? `You may propose a revised graph (replan ${replan.used + 1} of ${replan.limit}) or answer the request from these results.`
      : "Now answer the request from these results.",
  );
  return parts.join("\n");
}
