// Revising a running WorkGraph after a refinement (issue #14): the root is handed what is done and
// proposes again, and the nodes of the new proposal that match finished ones are kept with their
// results instead of running again. Pure functions; the scheduler pass and the proposal tool use them.
import { combineOutputs } from "./work-graph-schedule.js";

/** A node of the previous revision that succeeded. */
export interface FinishedNode {
  readonly key: string;
  readonly kind: string;
  readonly objective: string;
  readonly dependsOn: readonly string[];
  readonly output: string | undefined;
}

/** The proposing call's result when a refinement stops the graph: what is kept, what did not run, and the way on. */
export function revisionResult(
  nodes: readonly { readonly key: string; readonly status: string; readonly output: string | undefined }[],
  revisions: { readonly used: number; readonly limit: number },
): string {
  const finished = nodes.filter((node) => node.status === "succeeded");
  const unrun = nodes.filter((node) => node.status !== "succeeded");
  const parts = [`A new message in the conversation refined the request while the work graph ran, so the graph stopped: ${finished.length} of ${nodes.length} nodes had finished.`];
  if (finished.length > 0) parts.push("Results of the finished nodes:", combineOutputs(finished));
  if (unrun.length > 0) parts.push(`Not run: ${unrun.map((node) => `"${node.key}"`).join(", ")}.`);
  parts.push(
    `Read the new message, then propose a revised graph (revision ${revisions.used + 1} of ${revisions.limit}) or answer the request yourself. ` +
      "A node you propose again with the same key, kind and objective as a finished one, whose inputs are all kept too, keeps its result and does not run again.",
  );
  return parts.join("\n");
}

/**
 * The nodes of a revised proposal that keep their previous results, with those results: same key,
 * kind and objective as a node that succeeded before, and every input kept as well (a node fed by
 * something new must run again). Gates are never kept: a person decides again on what is new.
 */
export function keptNodes(
  previous: readonly FinishedNode[],
  proposed: readonly { readonly key: string; readonly kind: string; readonly objective: string; readonly dependsOn: readonly string[] }[],
): Map<string, string> {
  const before = new Map(previous.map((node) => [node.key, node]));
  const kept = new Map<string, string>();
  // Proposals are admitted in topological order, so a node's inputs are decided before it.
  for (const node of proposed) {
    const old = before.get(node.key);
    if (old === undefined || node.kind === "human_gate" || old.kind !== node.kind || old.objective !== node.objective) continue;
    if (!node.dependsOn.every((input) => kept.has(input))) continue;
    kept.set(node.key, old.output ?? "");
  }
  return kept;
}
