import { RunStatusSchema } from "../../../gen/keel/v1/run_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { fromEnum } from "../api/convert.js";
import { connect, type ClientOptions } from "./client.js";

export interface ResumeOptions {
  readonly runId: string;
  readonly actor: string;
  readonly reason: string;
}

/** Lifts an operator's pause; a queued run is picked up again by the next free worker. */
export async function resumeCommand(client: ClientOptions, options: ResumeOptions, out: (line: string) => void): Promise<number> {
  const runs = connect(RunService, client);
  const { run } = await runs.resumeRun({ runId: options.runId, actor: { id: options.actor }, reason: options.reason });
  out(`run ${options.runId} resumed by ${options.actor}; status ${run === undefined ? "?" : (fromEnum(RunStatusSchema, run.status) ?? "?")}`);
  return 0;
}
