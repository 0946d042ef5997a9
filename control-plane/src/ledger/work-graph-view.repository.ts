// GetWorkGraph's read (issue #14): the live graph of a root run, or of the root a child run
// belongs to, with each node's attempts and the spend of the graph's child runs.
import { ZERO_USAGE, type RunUsage } from "../domain/run.js";
import { asDate, optionalDate, type Sql } from "./sql.js";
import * as q from "./work-graph.sql.js";

export interface WorkNodeAttemptView {
  readonly id: string;
  readonly ordinal: number;
  readonly status: string;
  readonly replayability: string;
  readonly childRunId: string | undefined;
  readonly startedAt: Date;
  readonly finishedAt: Date | undefined;
}

export interface WorkNodeView {
  readonly id: string;
  readonly key: string;
  readonly kind: string;
  readonly status: string;
  readonly objective: string;
  readonly dependsOn: readonly string[];
  readonly gateDecision: string | undefined;
  readonly gateDecidedByActorId: string | undefined;
  readonly gateReason: string | undefined;
  readonly attempts: readonly WorkNodeAttemptView[];
}

export interface WorkGraphView {
  readonly id: string;
  readonly rootRunId: string;
  readonly revision: number;
  readonly replans: number;
  readonly status: string;
  /** What the graph's child runs have spent so far, summed. */
  readonly usage: RunUsage;
  readonly createdAt: Date;
  readonly nodes: readonly WorkNodeView[];
}

export interface WorkGraphReads {
  /** The graph of a root run, or of the root a child run belongs to. */
  graphOf(runId: string): Promise<WorkGraphView | undefined>;
}

const USAGE_KEYS = Object.keys(ZERO_USAGE) as (keyof RunUsage)[];

/** Spend added up; wall clock is not (the root's own clock already covers its children's time). */
export function addUsage(base: Partial<RunUsage>, parts: readonly (Partial<RunUsage> | null)[]): RunUsage {
  const total: Record<keyof RunUsage, number> = { ...ZERO_USAGE, ...base };
  for (const part of parts) {
    if (part === null) continue;
    for (const key of USAGE_KEYS) if (key !== "wallClockMs") total[key] += Number(part[key] ?? 0);
  }
  return total;
}

export function createWorkGraphReads(sql: Sql): WorkGraphReads {
  return {
    async graphOf(runId) {
      const [graph] = await sql.run(q.graphView, { runId });
      if (graph === undefined) return undefined;
      const nodes = await sql.run(q.nodesView, { graphId: graph.id });
      return {
        id: graph.id,
        rootRunId: graph.root_run_id,
        revision: graph.revision,
        replans: graph.replans,
        status: graph.status,
        usage: addUsage({}, graph.child_usages ?? []),
        createdAt: asDate(graph.created_at),
        nodes: nodes.map((node) => ({
          id: node.id,
          key: node.key,
          kind: node.kind,
          status: node.status,
          objective: node.objective,
          dependsOn: node.depends_on,
          gateDecision: node.gate_decision ?? undefined,
          gateDecidedByActorId: node.gate_decided_by_actor_id ?? undefined,
          gateReason: node.gate_reason ?? undefined,
          attempts: (node.attempts ?? []).map((attempt) => ({
            id: attempt.id,
            ordinal: attempt.ordinal,
            status: attempt.status,
            replayability: attempt.replayability,
            childRunId: attempt.child_run_id ?? undefined,
            startedAt: asDate(attempt.started_at),
            finishedAt: optionalDate(attempt.finished_at),
          })),
        })),
      };
    },
  };
}
