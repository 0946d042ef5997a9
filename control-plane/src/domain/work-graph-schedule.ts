// What the scheduler does next with an admitted WorkGraph (issue #14 item 4), decided from the
// nodes' statuses as the ledger holds them. Pure: the ledger's scheduler pass reads the nodes,
// asks planSchedule, and writes what it says in the same transaction, so the plan never acts on
// state another pass has changed.
import type { WorkNodeKind } from "./work-graph.js";

export const WORK_NODE_STATUSES = ["pending", "ready", "running", "succeeded", "failed", "cancelled", "blocked"] as const;
export type WorkNodeStatus = (typeof WORK_NODE_STATUSES)[number];

export interface ScheduledNode {
  readonly key: string;
  readonly kind: WorkNodeKind;
  readonly status: WorkNodeStatus;
  /** Input keys. */
  readonly dependsOn: readonly string[];
  /** What a finished node handed on (a child's reply, a join's combination). */
  readonly output: string | undefined;
  /** human_gate only: the decision recorded on it, if any. */
  readonly gate?: GateDecisionRecord;
  /** join only: an input ran in a workspace of its own, so the join reconciles workspaces outside the pass. */
  readonly reconciles?: boolean;
}

export const GATE_DECISIONS = ["approve", "reject"] as const;
export type GateDecision = (typeof GATE_DECISIONS)[number];

/** Who decided a gate, how and why. */
export interface GateDecisionRecord {
  readonly decision: GateDecision;
  readonly actorId: string;
  readonly reason: string;
}

export type GraphOutcome = "running" | "succeeded" | "failed";

/** What a scheduler pass leaves: a plan's outcome, or `revised` (a refinement stopped the graph around its finished nodes, and the root plans again). */
export type PassOutcome = GraphOutcome | "revised";

export interface SchedulePlan {
  /**
   * Join nodes whose inputs all succeeded, and decided gates whose inputs did: done now (a
   * rejected gate failed), with their inputs' outputs combined.
   */
  readonly joined: readonly { readonly key: string; readonly status: "succeeded" | "failed"; readonly output: string }[];
  /**
   * Joins whose inputs all succeeded and ran in workspaces: due for reconciliation (status
   * ready), which reads and writes files, so it happens between passes, not in one.
   */
  readonly reconcile: readonly string[];
  /** Gates whose inputs all succeeded and that wait for a decision (status blocked). */
  readonly awaitingDecision: readonly string[];
  /** agent_loop nodes to start as child runs now, within the parallelism ceiling. */
  readonly start: readonly string[];
  /** Nodes whose inputs are done but which wait for a free slot. */
  readonly ready: readonly string[];
  /** Nodes that will never run because an input failed or was cancelled. */
  readonly cancelled: readonly string[];
  readonly outcome: GraphOutcome;
}

/** A node's output is cut to this many characters where it is handed on, so fan-in stays bounded. */
export const MAX_HANDED_OUTPUT_CHARS = 8_000;

function bounded(text: string): string {
  return text.length <= MAX_HANDED_OUTPUT_CHARS ? text : `${text.slice(0, MAX_HANDED_OUTPUT_CHARS)}\n[… cut at ${MAX_HANDED_OUTPUT_CHARS} characters]`;
}

/** Outputs of named nodes as labelled blocks, in the order given. */
export function combineOutputs(parts: readonly { readonly key: string; readonly output: string | undefined }[]): string {
  return parts.map((part) => `--- ${part.key} ---\n${bounded(part.output ?? "")}`).join("\n\n");
}

const DONE: ReadonlySet<WorkNodeStatus> = new Set(["succeeded", "failed", "cancelled"]);

/**
 * The next scheduling step. `nodes` are in topological order (as admitted), so a join completed
 * here is seen as succeeded by the nodes after it in the same pass. After any failure nothing new
 * starts: children already running finish, then the graph ends failed.
 */
export function planSchedule(nodes: readonly ScheduledNode[], maxParallelism: number): SchedulePlan {
  const status = new Map<string, WorkNodeStatus>(nodes.map((node) => [node.key, node.status]));
  const output = new Map<string, string | undefined>(nodes.map((node) => [node.key, node.output]));
  const joined: { key: string; status: "succeeded" | "failed"; output: string }[] = [];
  const reconcile: string[] = [];
  const awaitingDecision: string[] = [];
  const candidates: string[] = [];
  const cancelled: string[] = [];
  let failed = nodes.some((node) => node.status === "failed" || node.status === "cancelled");
  for (const node of nodes) {
    const now = status.get(node.key);
    if (now !== "pending" && now !== "ready" && now !== "blocked") continue;
    const inputs = node.dependsOn.map((key) => status.get(key));
    if (failed || inputs.some((s) => s === "failed" || s === "cancelled")) {
      status.set(node.key, "cancelled");
      cancelled.push(node.key);
      failed = true;
      continue;
    }
    if (!inputs.every((s) => s === "succeeded")) continue;
    if (node.kind === "join" && node.reconciles === true) {
      reconcile.push(node.key);
      continue;
    }
    if (node.kind === "join") {
      const combined = combineOutputs(node.dependsOn.map((key) => ({ key, output: output.get(key) })));
      status.set(node.key, "succeeded");
      output.set(node.key, combined);
      joined.push({ key: node.key, status: "succeeded", output: combined });
      continue;
    }
    if (node.kind === "human_gate") {
      if (node.gate === undefined) {
        status.set(node.key, "blocked");
        awaitingDecision.push(node.key);
        continue;
      }
      // A gate hands on what reached it, headed by who let it through (or why it did not).
      const approved = node.gate.decision === "approve";
      const inputs = combineOutputs(node.dependsOn.map((key) => ({ key, output: output.get(key) })));
      const verdict = `${approved ? "Approved" : "Rejected"} by ${node.gate.actorId}: ${node.gate.reason}`;
      const handed = inputs === "" ? verdict : `${verdict}\n\n${inputs}`;
      status.set(node.key, approved ? "succeeded" : "failed");
      output.set(node.key, handed);
      joined.push({ key: node.key, status: approved ? "succeeded" : "failed", output: handed });
      if (!approved) failed = true;
      continue;
    }
    candidates.push(node.key);
  }
  const running = nodes.filter((node) => node.status === "running").length;
  const room = failed ? 0 : Math.max(0, maxParallelism - running);
  const start = candidates.slice(0, room);
  const ready = candidates.slice(room);
  let outcome: GraphOutcome = "running";
  if (running === 0 && start.length === 0) {
    if (failed) outcome = "failed";
    else if (nodes.every((node) => DONE.has(status.get(node.key) ?? "pending"))) outcome = "succeeded";
  }
  return { joined, reconcile, awaitingDecision, start, ready, cancelled, outcome };
}

/** The graph's sinks (no dependants), in node order: their outputs are the graph's result. */
export function sinkKeys(nodes: readonly Pick<ScheduledNode, "key" | "dependsOn">[]): string[] {
  const feeds = new Set(nodes.flatMap((node) => node.dependsOn));
  return nodes.filter((node) => !feeds.has(node.key)).map((node) => node.key);
}

/** What a gate decision does to a node as it stands: recorded, already so, or refused with why. */
export type GateJudgement = { readonly kind: "record" } | { readonly kind: "already" } | { readonly kind: "refuse"; readonly reason: string };

const DECIDED: Readonly<Record<GateDecision, string>> = { approve: "approved", reject: "rejected" };

/**
 * A gate takes one decision, once it waits for it (its inputs all succeeded). The decider's own
 * decision again is answered as done, so a retried call is harmless; any other is refused.
 */
export function judgeGateDecision(
  node: { readonly key: string; readonly kind: string; readonly status: string; readonly decision: GateDecision | undefined; readonly decidedBy: string | undefined },
  decision: GateDecision,
  actorId: string,
): GateJudgement {
  if (node.kind !== "human_gate") return { kind: "refuse", reason: `node "${node.key}" is a ${node.kind} node, not a human_gate` };
  if (node.decision !== undefined) {
    return node.decision === decision && node.decidedBy === actorId
      ? { kind: "already" }
      : { kind: "refuse", reason: `gate "${node.key}" was already ${DECIDED[node.decision]} by ${node.decidedBy ?? "someone"}` };
  }
  if (node.status === "blocked") return { kind: "record" };
  if (node.status === "pending" || node.status === "ready") {
    return { kind: "refuse", reason: `gate "${node.key}" is not waiting for a decision yet: the nodes before it have not all succeeded` };
  }
  return { kind: "refuse", reason: `gate "${node.key}" is ${node.status}: a node before it failed or the root run stopped` };
}

export const isGateDecision = (value: string | null | undefined): value is GateDecision => value === "approve" || value === "reject";
