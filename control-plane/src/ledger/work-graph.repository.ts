// The WorkGraph ledger (issue #14): admission's writes, gate decisions and the scheduler pass
// (GetWorkGraph's read is work-graph-view.repository.ts).
// A pass holds the graph's row lock from its first read to its commit, so passes from any number
// of processes take turns and each acts on what the one before it committed.
import { randomUUID } from "node:crypto";
import type { WorkerHandoff } from "../conversation/worker-handoff.js";
import { systemClock, type Clock } from "../domain/clock.js";
import { LIVE_STATUSES, ZERO_USAGE, type RunStatus, type RunUsage } from "../domain/run.js";
import type { WorkNodeKind } from "../domain/work-graph.js";
import { childInput, graphResult, verifierVerdict } from "../domain/work-graph-child.js";
import { revisionResult } from "../domain/work-graph-revision.js";
import {
  isGateDecision,
  judgeGateDecision,
  planSchedule,
  sinkKeys,
  type PassOutcome,
  type ScheduledNode,
  type SchedulePlan,
  type WorkNodeStatus,
} from "../domain/work-graph-schedule.js";
import type { AdmitGraphCommand, GateDecisionCommand, GateDecisionOutcome, JoinJob, PassResult, WorkGraphLedger } from "../graph/work-graph-ledger.js";
import { appendRunEvents } from "./ledger-writes.js";
import { claimQueuedRoot } from "./run-claim.repository.js";
import { childClaim, passingWith, type PassHandovers } from "./work-graph-handovers.js";
import { asDate, type Sql, type SqlTransaction } from "./sql.js";
import { addUsage } from "./work-graph-view.repository.js";
import * as q from "./work-graph.sql.js";

/** A node's status once a pass's plan applies: cancelled, or joined (a join, a decided gate), or as it was. */
function statusAfter(key: string, status: WorkNodeStatus, plan: SchedulePlan): WorkNodeStatus {
  if (plan.cancelled.includes(key)) return "cancelled";
  return plan.joined.find((j) => j.key === key)?.status ?? status;
}

/** Nodes that will not run now: their graph stopped, or a revision replans them. */
async function cancelNodes(trx: SqlTransaction, ids: readonly string[]): Promise<void> {
  if (ids.length === 0) return;
  await trx.run(q.settleNodes, { nodes: JSON.stringify(ids.map((id) => ({ id, status: "cancelled", output: null }))), attempts: "[]" });
}

const CHILD_END: Readonly<Record<string, WorkNodeStatus>> = { succeeded: "succeeded", failed: "failed", budget_exhausted: "failed", cancelled: "cancelled" };

export interface WorkGraphRepositoryOptions {
  /** Hands started children and woken roots to idle workers of this process. */
  readonly handoff?: WorkerHandoff;
  /** The clock claims decide on (run-claim.repository.ts): children are due, and roots claimed, on it. */
  readonly clock?: Clock;
}

export function createWorkGraphRepository(sql: Sql, { handoff, clock = systemClock }: WorkGraphRepositoryOptions = {}): WorkGraphLedger {
  const passing = passingWith(sql, handoff);

  /** One pass, inside the caller's transaction, with the joins it found due for reconciliation. */
  const pass = async (trx: SqlTransaction, rootRunId: string, handovers: PassHandovers): Promise<PassResult | undefined> => {
    const reconcile: JoinJob[] = [];
    const outcome = await passOutcome(trx, rootRunId, reconcile, handovers);
    return outcome === undefined ? undefined : { outcome, reconcile };
  };

  const passOutcome = async (trx: SqlTransaction, rootRunId: string, reconcile: JoinJob[], handovers: PassHandovers): Promise<PassOutcome | undefined> => {
    const [graph] = await trx.run(q.lockGraph, { rootRunId });
    if (graph === undefined) return undefined;
    const rows = await trx.run(q.passNodes, { graphId: graph.id });
    const inWorkspace = new Set(rows.filter((row) => row.needs_workspace).map((row) => row.key));
    const nodeUpdates: { id: string; status: WorkNodeStatus; output: string | null }[] = [];
    const attemptUpdates: { id: string; status: WorkNodeStatus }[] = [];
    const nodes: ScheduledNode[] = rows.map((row) => {
      let status = row.status as WorkNodeStatus;
      let output = row.output ?? undefined;
      const ended = row.child_status === null ? undefined : CHILD_END[row.child_status];
      if (status === "running" && ended !== undefined && row.attempt_id !== null) {
        // The child settled: its reply (or why it failed) is the node's output; a verifier's reply is its verdict.
        status = ended;
        output = ended === "succeeded" ? (row.final_reply ?? "") : (row.error ?? `the child run ended ${row.child_status ?? ""}`);
        if (ended === "succeeded" && row.kind === "verify") {
          const verdict = verifierVerdict(output);
          status = verdict.passed ? "succeeded" : "failed";
          output = verdict.output;
        }
        nodeUpdates.push({ id: row.id, status, output });
        attemptUpdates.push({ id: row.attempt_id, status });
      }
      const gate = isGateDecision(row.gate_decision)
        ? { decision: row.gate_decision, actorId: row.gate_decided_by_actor_id ?? "", reason: row.gate_reason ?? "" }
        : undefined;
      const reconciles = row.kind === "join" && row.depends_on.some((key) => inWorkspace.has(key));
      return { key: row.key, kind: row.kind as WorkNodeKind, status, dependsOn: row.depends_on, output, reconciles, ...(gate === undefined ? {} : { gate }) };
    });
    const byKey = new Map(rows.map((row) => [row.key, row]));
    const rootStopped = !(LIVE_STATUSES as readonly RunStatus[]).includes(graph.root_status);
    // A refinement asks for a revision: nothing new starts, and once nothing runs the root plans again.
    const revising = !rootStopped && graph.revision_due;
    const plan = rootStopped ? undefined : planSchedule(nodes, revising ? 0 : graph.max_parallelism);
    const outputs = new Map(nodes.map((node) => [node.key, node.output]));
    for (const joined of plan?.joined ?? []) {
      nodeUpdates.push({ id: byKey.get(joined.key)!.id, status: joined.status, output: joined.output });
      outputs.set(joined.key, joined.output);
    }
    for (const key of plan?.awaitingDecision ?? []) if (byKey.get(key)!.status !== "blocked") nodeUpdates.push({ id: byKey.get(key)!.id, status: "blocked", output: null });
    for (const key of plan?.cancelled ?? []) nodeUpdates.push({ id: byKey.get(key)!.id, status: "cancelled", output: null });
    for (const key of revising ? [] : (plan?.reconcile ?? [])) {
      const row = byKey.get(key)!;
      if (row.status !== "ready") nodeUpdates.push({ id: row.id, status: "ready", output: null });
      reconcile.push({
        nodeId: row.id,
        key,
        rootRunId,
        agentId: graph.agent_id,
        inputs: row.depends_on.map((input) => {
          const from = byKey.get(input)!;
          const workspace = from.needs_workspace && from.child_run_id !== null ? (from.child_workspace ?? "none") : "none";
          return { key: input, childRunId: from.child_run_id ?? undefined, workspace, output: outputs.get(input) };
        }),
      });
    }
    for (const key of plan?.ready ?? []) if (byKey.get(key)!.status !== "ready") nodeUpdates.push({ id: byKey.get(key)!.id, status: "ready", output: null });
    const settlement = { nodes: JSON.stringify(nodeUpdates), attempts: JSON.stringify(attemptUpdates) };
    const start = plan?.start ?? [];
    // Starting children carries the settlement in its own statement: one round trip fewer per node.
    if (start.length === 0 && (nodeUpdates.length > 0 || attemptUpdates.length > 0)) await trx.run(q.settleNodes, settlement);

    if (start.length > 0) {
      const children = start.map((key) => {
        const row = byKey.get(key)!;
        const node = nodes.find((n) => n.key === key)!;
        const worker = handovers.reserve();
        return {
          key,
          run_id: randomUUID(),
          message_id: randomUUID(),
          attempt_id: randomUUID(),
          node_id: row.id,
          ordinal: (row.attempt_ordinal ?? 0) + 1,
          input: childInput(
            { key, objective: row.objective },
            node.dependsOn.map((input) => ({ key: input, output: outputs.get(input) })),
            row.kind === "verify" && row.subject !== null ? { key: row.subject, output: outputs.get(row.subject) } : undefined,
          ),
          spec: row.child_spec ?? {},
          summary: `child run for node "${key}" of the work graph of run ${rootRunId}`,
          worker_id: worker?.workerId ?? null,
          lease_ms: worker?.leaseMs ?? null,
          worker,
        };
      });
      const now = clock.now();
      await trx.run(q.startChildren, {
        ...settlement,
        rootRunId,
        agentId: graph.agent_id,
        conversationId: graph.conversation_id,
        connector: graph.connector,
        actorId: graph.requested_by_actor_id,
        children: JSON.stringify(children.map(({ key: _key, worker: _worker, ...child }) => child)),
        rootSummary: `work graph: started ${children.map((c) => `"${c.key}"`).join(", ")} as child runs`,
        notBefore: now,
      });
      trx.notify("keel_run_events", rootRunId);
      for (const child of children) {
        if (child.worker !== undefined) handovers.claimed(child.worker, childClaim(graph, rootRunId, child, now));
      }
    }

    const childUsages = rows.map((row) => row.child_usage);
    if (rootStopped) {
      // Cancelling the root cancels every child at its next safe point; the graph ends when they have.
      await trx.run(q.cancelChildren, { rootRunId });
      if (nodes.some((node) => node.status === "running")) return "running";
      const unrun = nodes.filter((node) => node.status === "pending" || node.status === "ready");
      await cancelNodes(trx, unrun.map((node) => byKey.get(node.key)!.id));
      await trx.run(q.finishGraph, { graphId: graph.id, status: "cancelled", usage: JSON.stringify(addUsage({}, childUsages)) });
      return "failed";
    }
    if (plan === undefined) return "running";
    if (revising && plan.outcome === "running") {
      if (nodes.some((node) => node.status === "running")) return "running";
      return revise(trx, handovers, rootRunId, graph, nodes.map((node) => ({ key: node.key, status: statusAfter(node.key, node.status, plan), output: outputs.get(node.key) })), byKey, childUsages);
    }
    if (plan.outcome === "running") {
      // Nothing runs and a gate waits: the root waits on a person, and says so.
      const working = plan.start.length > 0 || nodes.some((node) => node.status === "running");
      const reason = !working && plan.awaitingDecision.length > 0 ? q.HUMAN_GATE : q.AWAITING_CHILDREN;
      // Most passes leave it as it is: the lock's read says so, and the round trip is spared.
      if (graph.root_wait_reason !== reason) await trx.run(q.rootWaitReason, { rootRunId, reason });
      return "running";
    }
    const finalNodes = nodes.map((node) => ({
      key: node.key,
      status: statusAfter(node.key, node.status, plan),
      output: outputs.get(node.key),
    }));
    const text = graphResult(plan.outcome, finalNodes, sinkKeys(nodes), { used: graph.replans, limit: graph.max_replans });
    return handBack(trx, handovers, rootRunId, graph, plan.outcome, text, childUsages, {
      settled: `work graph ${plan.outcome}: its result is the proposal's result`,
      woken: `work graph ${plan.outcome}; the root takes its turn with the results`,
    });
  };

  /**
   * Ends the graph and gives the root its turn: the proposing call settled with `text` (the
   * root's transcript reads it like any result), the root queued with its children's spend added,
   * and both said in the root's events.
   */
  const handBack = async <S extends PassOutcome>(
    trx: SqlTransaction,
    handovers: PassHandovers,
    rootRunId: string,
    graph: q.LockedGraphRow,
    status: S,
    text: string,
    childUsages: readonly (Partial<RunUsage> | null)[],
    say: { readonly settled: string; readonly woken: string },
  ): Promise<S> => {
    await trx.run(q.finishGraph, { graphId: graph.id, status, usage: JSON.stringify(addUsage({}, childUsages)) });
    const settled = graph.proposed_by_invocation_id === null ? [] : await trx.run(q.settleProposal, { invocationId: graph.proposed_by_invocation_id, rootRunId, text });
    const woken = await trx.run(q.wakeRoot, { rootRunId, usage: JSON.stringify(addUsage(graph.root_usage, childUsages)) });
    await appendRunEvents(trx, rootRunId, [
      ...settled.map((row) => ({ kind: "tool_settled" as const, toolInvocationId: row.id, summary: say.settled })),
      ...(woken.length > 0 ? [{ kind: "status_changed" as const, status: "queued" as const, summary: say.woken }] : []),
    ]);
    // The root's turn goes to an idle worker of this process if there is one, as its children did.
    const worker = woken.length > 0 ? handovers.reserve() : undefined;
    if (worker !== undefined) {
      const claimed = await claimQueuedRoot(trx, {
        runId: rootRunId,
        agentId: graph.agent_id,
        workerId: worker.workerId,
        leaseMs: worker.leaseMs,
        now: clock.now(),
        why: "handed its turn by the work graph pass",
      });
      if (claimed !== undefined) handovers.claimed(worker, claimed);
    }
    return status;
  };

  /** Stops the graph around its finished nodes for a refinement: the rest cancelled, the root woken to plan again. */
  const revise = async (
    trx: SqlTransaction,
    handovers: PassHandovers,
    rootRunId: string,
    graph: q.LockedGraphRow,
    nodes: readonly { key: string; status: string; output: string | undefined }[],
    byKey: ReadonlyMap<string, { id: string }>,
    childUsages: readonly (Partial<RunUsage> | null)[],
  ): Promise<PassOutcome> => {
    const unrun = nodes.filter((node) => node.status !== "succeeded");
    await cancelNodes(trx, unrun.map((node) => byKey.get(node.key)!.id));
    const text = revisionResult(nodes, { used: graph.revision - graph.replans, limit: graph.max_revisions });
    return handBack(trx, handovers, rootRunId, graph, "revised", text, childUsages, {
      settled: `work graph stopped for a refinement: ${nodes.length - unrun.length} finished node(s) handed to the root, ${unrun.length} not run`,
      woken: "a refinement arrived while the work graph ran; the root plans again",
    });
  };

  return {
    async proposerFacts(runId, toolName) {
      const [row] = await sql.run(q.proposerFacts, { runId, toolName });
      if (row === undefined) return undefined;
      return {
        connector: row.connector,
        usage: { ...ZERO_USAGE, ...row.usage },
        startedAt: asDate(row.started_at),
        isChild: row.child,
        ...(row.last_graph === null
          ? {}
          : {
              lastGraph: {
                status: row.last_graph.status,
                revision: row.last_graph.revision,
                replans: row.last_graph.replans,
                finished: (row.last_graph.finished ?? []).map((n) => ({ key: n.key, kind: n.kind, objective: n.objective, dependsOn: n.depends_on, output: n.output ?? undefined })),
              },
            }),
        rejectedSoFar: Number(row.rejected),
      };
    },

    recordEvents: (runId, invocationId, summaries) =>
      sql.transaction((trx) => appendRunEvents(trx, runId, summaries.map((summary) => ({ kind: "tool_invoked" as const, toolInvocationId: invocationId, summary })))),

    admit: (command: AdmitGraphCommand) =>
      passing(
        async (trx, handovers) => {
          const parked = await trx.run(q.parkRoot, { runId: command.runId, epoch: command.epoch });
          if (parked.length === 0) return false;
          const graphId = randomUUID();
          await trx.run(q.insertGraph, { graphId, runId: command.runId, invocationId: command.invocationId, revision: command.revision, replans: command.graph.replans });
          const nodes = command.graph.nodes.map((node, ordinal) => ({
            id: randomUUID(),
            key: node.key,
            kind: node.kind,
            objective: node.objective,
            depends_on: node.dependsOn,
            ordinal,
            child_spec: command.childSpecs[node.key] ?? null,
            subject: node.kind === "verify" ? (node.subject ?? null) : null,
            needs_workspace: node.needsWorkspace,
            kept_output: command.kept?.get(node.key) ?? null,
          }));
          await trx.run(q.insertNodes, { graphId, nodes: JSON.stringify(nodes) });
          await appendRunEvents(trx, command.runId, [
            { kind: "status_changed", status: "waiting", toolInvocationId: command.invocationId, summary: command.summary },
          ]);
          // The pass makes this commit skip its WAL flush too: if it is lost, the root's last durable
          // state is its step with the proposal pending, which recovery settles as interrupted.
          await pass(trx, command.runId, handovers);
          return true;
        },
        (kept) => kept,
      ),

    advance: (rootRunId) => passing((trx, handovers) => pass(trx, rootRunId, handovers)),

    settleJoins: (rootRunId, joins) =>
      passing(async (trx, handovers) => {
        const settled = await trx.run(q.settleJoins, { rootRunId, joins: JSON.stringify(joins.map((j) => ({ id: j.nodeId, status: j.status, output: j.output }))) });
        if (settled.length > 0) {
          const keys = new Set(settled.map((row) => row.id));
          await appendRunEvents(
            trx,
            rootRunId,
            joins
              .filter((j) => keys.has(j.nodeId))
              .map((j) => ({
                kind: "status_changed" as const,
                status: "waiting" as const,
                summary: j.status === "succeeded" ? `work graph: join "${j.key}" reconciled its inputs' workspaces` : `work graph: join "${j.key}" failed: ${j.output}`,
              })),
          );
        }
        return pass(trx, rootRunId, handovers);
      }),

    decideGate: (command: GateDecisionCommand) =>
      sql.transaction(async (trx): Promise<GateDecisionOutcome> => {
        const [node] = await trx.run(q.lockGate, { runId: command.runId, gate: command.gate });
        if (node === undefined) return { kind: "not_found" };
        const judged = judgeGateDecision(
          {
            key: node.key,
            kind: node.kind,
            status: node.status,
            decision: isGateDecision(node.gate_decision) ? node.gate_decision : undefined,
            decidedBy: node.gate_decided_by_actor_id ?? undefined,
          },
          command.decision,
          command.actorId,
        );
        if (judged.kind === "refuse") return { kind: "refused", reason: judged.reason };
        if (judged.kind === "record") {
          await trx.run(q.recordGateDecision, { nodeId: node.id, decision: command.decision, actorId: command.actorId, reason: command.reason });
          const verb = command.decision === "approve" ? "approved" : "rejected";
          await appendRunEvents(trx, node.root_run_id, [{ kind: "status_changed", status: "waiting", summary: `gate "${node.key}" ${verb} by ${command.actorId}: ${command.reason}` }]);
        }
        return { kind: judged.kind === "record" ? "recorded" : "already", rootRunId: node.root_run_id };
      }),

    async stalledRoots() {
      const rows = await sql.run(q.stalledRoots, {});
      return rows.map((row) => row.root_run_id);
    },
  };
}
