// Starting runs of a WorkGraph pass on this process's idle workers (issue #14): a pass writes a
// new child (or the root whose graph ended) already claimed for a reserved worker, and the worker
// is handed that claim once the pass commits, skipping the wake-up and a claim transaction.
import type { ReservedWorker, WorkerHandoff } from "../conversation/worker-handoff.js";
import type { AgentSpec } from "../domain/agent.js";
import { ZERO_USAGE } from "../domain/run.js";
import type { ClaimedRun } from "../runner/run-store.js";
import type { Sql, SqlTransaction } from "./sql.js";
import type { LockedGraphRow } from "./work-graph.sql.js";

/**
 * Idle workers of this process a pass starts runs on (its new children, or the root whose graph
 * ended): the run is written already claimed for the worker, which is handed the claim once the
 * pass commits, so it skips the wake-up and the claim's own transaction. A pass that rolls back
 * hands nothing over and lets the workers go.
 */
export class PassHandovers {
  private readonly taken: { readonly worker: ReservedWorker; claimed?: ClaimedRun }[] = [];

  constructor(private readonly handoff: WorkerHandoff | undefined) {}

  reserve(): ReservedWorker | undefined {
    const worker = this.handoff?.reserve();
    if (worker !== undefined) this.taken.push({ worker });
    return worker;
  }

  claimed(worker: ReservedWorker, claimed: ClaimedRun): void {
    const entry = this.taken.find((t) => t.worker === worker);
    if (entry !== undefined) entry.claimed = claimed;
  }

  /** After the commit: each worker starts on its child (nothing to wait for); the rest go back to claiming. */
  committed(): void {
    for (const { worker, claimed } of this.taken.splice(0)) {
      if (claimed === undefined) worker.release();
      else worker.start(claimed, Promise.resolve());
    }
  }

  rolledBack(): void {
    for (const { worker } of this.taken.splice(0)) worker.release();
  }
}

/**
 * A transaction whose passes may start runs on this process's idle workers: the workers are
 * handed their claims if it commits and let go if it rolls back (or `keep` says not to keep it).
 */
export function passingWith(sql: Sql, handoff: WorkerHandoff | undefined) {
  return async <T>(work: (trx: SqlTransaction, handovers: PassHandovers) => Promise<T>, keep?: (result: T) => boolean): Promise<T> => {
    const handovers = new PassHandovers(handoff);
    let result: T;
    try {
      result = await sql.transaction((trx) => work(trx, handovers), keep);
    } catch (error) {
      handovers.rolledBack();
      throw error;
    }
    if (keep === undefined || keep(result)) handovers.committed();
    else handovers.rolledBack();
    return result;
  };
}

/**
 * The claim of a child run the pass has just written for a worker, as claim_run would return it:
 * the root's agent with the node's override merged over it (as a claim merges spec_override),
 * its one input message, no reply target, lease epoch 1.
 */
export function childClaim(
  graph: Pick<LockedGraphRow, "agent_spec" | "connector" | "conversation_id" | "requested_by_actor_id">,
  rootRunId: string,
  child: { readonly run_id: string; readonly node_id: string; readonly ordinal: number; readonly input: string; readonly spec: Record<string, unknown> },
  now: Date,
): ClaimedRun {
  return {
    runId: child.run_id,
    epoch: 1,
    agent: { ...graph.agent_spec, ...child.spec } as unknown as AgentSpec,
    connector: graph.connector,
    status: "queued",
    stepCount: 0,
    usage: ZERO_USAGE,
    startedAt: now,
    cancelRequestedByActorId: undefined,
    supersededByRunId: undefined,
    messages: [{ messageId: `graph-node:${child.node_id}:${child.ordinal}`, actorId: graph.requested_by_actor_id, text: child.input, relation: "initial", afterStep: 0, inherited: false }],
    triggerCount: 1,
    requestedByActorId: graph.requested_by_actor_id,
    replyToMessageId: undefined,
    logicalRequestId: child.run_id,
    commitBoundary: "buffering",
    inheritsFromRunId: undefined,
    conversationId: graph.conversation_id,
    parentRunId: rootRunId,
  };
}
