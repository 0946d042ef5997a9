// The graph layer's port to the ledger (ledger/work-graph.repository.ts implements it): what a
// proposal is judged against, how an admitted graph is persisted with its root parked, and the
// scheduler pass that moves a graph on. The scheduler's whole state is these rows.
import type { AdmittedWorkGraph } from "../domain/work-graph.js";
import type { FinishedNode } from "../domain/work-graph-revision.js";
import type { GateDecision, PassOutcome } from "../domain/work-graph-schedule.js";
import type { RunUsage } from "../domain/run.js";

/** What the proposing run's row says, read when its proposal is judged. */
export interface ProposerFacts {
  readonly connector: string;
  /** The run's usage as of its last commit (the proposing step's model call included). */
  readonly usage: RunUsage;
  readonly startedAt: Date;
  /** A child run: it may not plan a graph of its own (no recursive graphs). */
  readonly isChild: boolean;
  /**
   * The run's latest graph, if it has one: a replan may follow only one that failed, a revision
   * one a refinement stopped (`revised`), which keeps what finished.
   */
  readonly lastGraph?: { readonly status: string; readonly revision: number; readonly replans: number; readonly finished: readonly FinishedNode[] };
  /** Proposals of this run already refused (their calls failed). */
  readonly rejectedSoFar: number;
}

export interface AdmitGraphCommand {
  readonly runId: string;
  /** The proposing worker's lease epoch: admission is fenced like every write of the run. */
  readonly epoch: number;
  /** The pending call that proposed the graph: it gets the graph's result when the graph ends. */
  readonly invocationId: string;
  readonly graph: AdmittedWorkGraph;
  /** 0 for the root's first graph, one more for each replan or revision. */
  readonly revision: number;
  /** A revision's nodes kept from the graph before it, by key: they start succeeded with this output. */
  readonly kept?: ReadonlyMap<string, string>;
  /** Per node key, what its child run's agent spec overrides (tools, policy, budget). */
  readonly childSpecs: Readonly<Record<string, Record<string, unknown>>>;
  /** The run event that explains the change of shape. */
  readonly summary: string;
}

export interface GateDecisionCommand {
  /** Any run of the graph: its root's live graph is the one meant. */
  readonly runId: string;
  /** The gate node's id or key. */
  readonly gate: string;
  readonly decision: GateDecision;
  readonly actorId: string;
  readonly reason: string;
}

export type GateDecisionOutcome =
  | { readonly kind: "recorded" | "already"; readonly rootRunId: string }
  | { readonly kind: "not_found" }
  | { readonly kind: "refused"; readonly reason: string };

/** An input of a join due for reconciliation: its child run, if it had one, and that run's workspace. */
export interface JoinInput {
  readonly key: string;
  readonly childRunId: string | undefined;
  /** Still there to read, gone (released or lost with its host) or never placed (the node had none, or never used it). */
  readonly workspace: "active" | "gone" | "none";
  /** What the input handed on (its child's reply): the join's report carries it. */
  readonly output: string | undefined;
}

/** A join whose inputs all succeeded in workspaces of their own: the scheduler reconciles them into the root's. */
export interface JoinJob {
  readonly nodeId: string;
  readonly key: string;
  readonly rootRunId: string;
  readonly agentId: string;
  readonly inputs: readonly JoinInput[];
}

/** What a pass left, and the joins it found due for reconciliation (done between passes, since they touch workspaces). */
export interface PassResult {
  readonly outcome: PassOutcome;
  readonly reconcile: readonly JoinJob[];
}

/** A reconciled join: succeeded with its report, or failed with why. */
export interface JoinSettlement {
  readonly nodeId: string;
  readonly key: string;
  readonly status: "succeeded" | "failed";
  readonly output: string;
}

export interface WorkGraphLedger {
  proposerFacts(runId: string, toolName: string): Promise<ProposerFacts | undefined>;
  /** Appends events to the proposing run (one per rejection reason, and a fallback notice). */
  recordEvents(runId: string, invocationId: string, summaries: readonly string[]): Promise<void>;
  /**
   * In one transaction: the graph and its nodes, the run's shape set to graph and the run parked
   * (waiting, lease released and its epoch raised so the proposing worker writes nothing more),
   * and the first ready nodes started as child runs. False when the lease was no longer held.
   */
  admit(command: AdmitGraphCommand): Promise<boolean>;
  /**
   * One scheduler pass over root run `rootRunId`'s graph, under the graph's row lock: settled
   * children settle their nodes, joins complete, ready nodes start, and an ended graph hands its
   * result to the root's proposing call and queues the root. Undefined when there is no live graph.
   */
  advance(rootRunId: string): Promise<PassResult | undefined>;
  /** Settles reconciled joins (those still due) and runs a pass in the same transaction. */
  settleJoins(rootRunId: string, joins: readonly JoinSettlement[]): Promise<PassResult | undefined>;
  /**
   * Records a decision on a gate that waits for one, with a root run event, under the graph's row
   * lock (a pass then lets the gate through or fails it); the decider's own decision again is "already".
   */
  decideGate(command: GateDecisionCommand): Promise<GateDecisionOutcome>;
  /** Root runs whose live graph has work a pass would do (a child settled, a gate decided, the root stopped). */
  stalledRoots(): Promise<readonly string[]>;
}
