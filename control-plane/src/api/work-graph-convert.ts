// A WorkGraph as GetWorkGraph answers it: the ledger's view in wire terms (enum names are the
// domain's strings, uppercased, as everywhere in convert.ts).
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { ReplayabilitySchema } from "../../../gen/keel/v1/run_pb.js";
import { GateDecisionSchema, WorkGraphSchema, WorkNodeKindSchema, WorkNodeStatusSchema, type WorkGraph } from "../../../gen/keel/v1/work_graph_pb.js";
import type { WorkGraphView } from "../ledger/work-graph-view.repository.js";
import { toEnum } from "./convert.js";

export function workGraphToProto(graph: WorkGraphView): WorkGraph {
  return create(WorkGraphSchema, {
    id: graph.id,
    rootRunId: graph.rootRunId,
    revision: graph.revision,
    replans: graph.replans,
    createdAt: timestampFromDate(graph.createdAt),
    aggregateUsage: {
      iterations: graph.usage.iterations,
      modelCalls: graph.usage.modelCalls,
      toolCalls: graph.usage.toolCalls,
      inputTokens: BigInt(graph.usage.inputTokens),
      outputTokens: BigInt(graph.usage.outputTokens),
      outputBytes: BigInt(graph.usage.outputBytes),
      costMicroUsd: BigInt(graph.usage.costMicroUsd),
      wallClockMs: BigInt(graph.usage.wallClockMs),
    },
    nodes: graph.nodes.map((node) => ({
      id: node.id,
      key: node.key,
      kind: toEnum(WorkNodeKindSchema, node.kind),
      status: toEnum(WorkNodeStatusSchema, node.status),
      objective: node.objective,
      dependsOn: [...node.dependsOn],
      gateDecision: toEnum(GateDecisionSchema, node.gateDecision),
      gateDecidedByActorId: node.gateDecidedByActorId ?? "",
      gateReason: node.gateReason ?? "",
      attempts: node.attempts.map((attempt) => ({
        id: attempt.id,
        ordinal: attempt.ordinal,
        status: toEnum(WorkNodeStatusSchema, attempt.status),
        replayability: toEnum(ReplayabilitySchema, attempt.replayability),
        childRunId: attempt.childRunId ?? "",
        startedAt: timestampFromDate(attempt.startedAt),
        ...(attempt.finishedAt === undefined ? {} : { finishedAt: timestampFromDate(attempt.finishedAt) }),
      })),
    })),
  });
}
