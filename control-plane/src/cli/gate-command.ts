import { GateDecision } from "../../../gen/keel/v1/work_graph_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { connect, type ClientOptions } from "./client.js";

export interface GateOptions {
  readonly runId: string;
  readonly gate: string;
  readonly decision: "approve" | "reject";
  readonly actor: string;
  readonly reason: string;
}

/** Decides a WorkGraph's human gate as an operator, and says what the graph does next. */
export async function gateCommand(client: ClientOptions, options: GateOptions, out: (line: string) => void): Promise<number> {
  const runs = connect(RunService, client);
  const { graph } = await runs.decideGate({
    runId: options.runId,
    gateId: options.gate,
    actor: { id: options.actor },
    decision: options.decision === "approve" ? GateDecision.APPROVE : GateDecision.REJECT,
    reason: options.reason,
  });
  const verb = options.decision === "approve" ? "approved" : "rejected";
  const next = options.decision === "approve" ? "the nodes after it may start" : "the graph fails and what follows it is cancelled";
  out(`gate ${options.gate} of run ${graph?.rootRunId ?? options.runId} ${verb} by ${options.actor}: ${next}`);
  return 0;
}
