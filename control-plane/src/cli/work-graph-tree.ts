// `keel inspect` draws a run's WorkGraph as a tree: pure, so fixtures can pin the drawing.
// A graph is a DAG, not a tree: a node with several inputs is drawn once, under its first input,
// and names the rest ("also after: x, y") so no edge is lost and nothing is drawn twice.
import { WorkNodeKindSchema, WorkNodeStatus, WorkNodeStatusSchema, type WorkGraph, type WorkNode } from "../../../gen/keel/v1/work_graph_pb.js";
import type { RunUsage } from "../../../gen/keel/v1/run_pb.js";
import { fromEnum } from "../api/convert.js";

const short = (id: string) => id.slice(0, 8);

/** Summary order: the live states first (what an operator waits on), then the bad endings. */
const SUMMARY_ORDER: readonly WorkNodeStatus[] = [
  WorkNodeStatus.RUNNING,
  WorkNodeStatus.READY,
  WorkNodeStatus.PENDING,
  WorkNodeStatus.BLOCKED,
  WorkNodeStatus.FAILED,
  WorkNodeStatus.CANCELLED,
];

/** Spend in the units budgets use; children's usage is added over every attempt of the node. */
function spendOf(node: WorkNode, usage: ReadonlyMap<string, RunUsage>): string {
  let calls = 0;
  let tokens = 0n;
  let cost = 0n;
  for (const attempt of node.attempts) {
    const used = usage.get(attempt.childRunId);
    if (used === undefined) continue;
    calls += used.modelCalls;
    tokens += used.inputTokens + used.outputTokens;
    cost += used.costMicroUsd;
  }
  return `${calls} model call${calls === 1 ? "" : "s"}, ${tokens} tokens, ${cost} µUSD`;
}

function nodeLine(node: WorkNode, usage: ReadonlyMap<string, RunUsage>, thisRunId: string): string {
  const kind = fromEnum(WorkNodeKindSchema, node.kind) ?? "?";
  const status = fromEnum(WorkNodeStatusSchema, node.status) ?? "?";
  const latest = node.attempts.at(-1)?.childRunId ?? "";
  const run = latest === "" ? "no run" : `run ${short(latest)}`;
  const attempts = `${node.attempts.length} attempt${node.attempts.length === 1 ? "" : "s"}`;
  const also = node.dependsOn.length > 1 ? `  also after: ${node.dependsOn.slice(1).join(", ")}` : "";
  const mine = node.attempts.some((a) => a.childRunId !== "" && a.childRunId === thisRunId) ? "  ← this run" : "";
  return `${node.key}  ${kind}  ${status}  ${run}  ${attempts}  ${spendOf(node, usage)}${also}${mine}`;
}

/** "3 of 5 nodes done, 1 running, 1 pending": done means succeeded; other states only when present. */
export function workGraphSummary(graph: WorkGraph): string {
  const count = (status: WorkNodeStatus) => graph.nodes.filter((n) => n.status === status).length;
  const rest = SUMMARY_ORDER.filter((s) => count(s) > 0).map((s) => `${count(s)} ${fromEnum(WorkNodeStatusSchema, s) ?? "?"}`);
  return [`${count(WorkNodeStatus.SUCCEEDED)} of ${graph.nodes.length} nodes done`, ...rest].join(", ");
}

/**
 * The lines of the tree: the root run, each node under its first input (nodes without inputs under
 * the root), then the summary. `usage` maps child run ids to their usage; `thisRunId` is marked.
 */
export function renderWorkGraphTree(graph: WorkGraph, usage: ReadonlyMap<string, RunUsage>, thisRunId: string): string[] {
  const keys = new Set(graph.nodes.map((n) => n.key));
  const under = new Map<string, WorkNode[]>();
  for (const node of graph.nodes) {
    // An input missing from the graph would orphan the node: it is drawn under the root instead.
    const first = node.dependsOn[0];
    const parent = first !== undefined && keys.has(first) ? first : "";
    under.set(parent, [...(under.get(parent) ?? []), node]);
  }
  const root = `root run ${short(graph.rootRunId)}${graph.rootRunId === thisRunId ? "  ← this run" : ""}`;
  const lines = [`work graph ${short(graph.id)}  revision ${graph.revision}, ${graph.replans} replans`, root];
  const drawn = new Set<string>();
  const draw = (parent: string, indent: string) => {
    const children = (under.get(parent) ?? []).filter((n) => !drawn.has(n.key));
    children.forEach((node, i) => {
      drawn.add(node.key);
      const last = i === children.length - 1;
      lines.push(`${indent}${last ? "└─ " : "├─ "}${nodeLine(node, usage, thisRunId)}`);
      draw(node.key, `${indent}${last ? "   " : "│  "}`);
    });
  };
  draw("", "");
  // Admission refuses cycles; should one reach us anyway, its nodes are still listed, flat.
  for (const node of graph.nodes) if (!drawn.has(node.key)) lines.push(`?  ${nodeLine(node, usage, thisRunId)}  (not reachable from the root)`);
  lines.push(workGraphSummary(graph));
  return lines;
}
