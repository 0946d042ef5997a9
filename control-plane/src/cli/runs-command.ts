import { RunStatus, RunStatusSchema } from "../../../gen/keel/v1/run_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { fromEnum, toEnum } from "../api/convert.js";
import { connect, type ClientOptions } from "./client.js";
import { formatTable } from "./table.js";

export interface RunsOptions {
  readonly agent?: string;
  readonly conversation?: string;
  readonly status?: string;
  readonly limit: number;
}

export async function runsCommand(client: ClientOptions, options: RunsOptions, out: (line: string) => void): Promise<number> {
  const status = options.status === undefined ? RunStatus.UNSPECIFIED : toEnum(RunStatusSchema, options.status);
  if (options.status !== undefined && status === 0) {
    out(`unknown status ${options.status}; one of: ${RunStatusSchema.values.slice(1).map((v) => v.localName.toLowerCase()).join(", ")}`);
    return 2;
  }
  const runs = connect(RunService, client);
  const response = await runs.listRuns({
    agentId: options.agent ?? "",
    conversationId: options.conversation ?? "",
    status,
    pageSize: options.limit,
  });
  out(
    formatTable(
      ["RUN", "AGENT", "CONVERSATION", "STATUS", "STEPS", "TOKENS", "CREATED"],
      response.runs.map((run) => [
        run.id,
        run.agentId,
        run.conversationId,
        fromEnum(RunStatusSchema, run.status) ?? "?",
        String(run.stepCount),
        String((run.usage?.inputTokens ?? 0n) + (run.usage?.outputTokens ?? 0n)),
        run.createdAt === undefined ? "" : new Date(Number(run.createdAt.seconds) * 1000).toISOString(),
      ]),
    ),
  );
  return 0;
}
