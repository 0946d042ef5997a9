import type { Timestamp } from "@bufbuild/protobuf/wkt";
import {
  ResolvedOutcome,
  ResolvedOutcomeSchema,
  RunStatus,
  RunStatusSchema,
  ToolInvocationStatus,
  type Run,
  type ToolInvocation,
} from "../../../gen/keel/v1/run_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { fromEnum } from "../api/convert.js";
import { connect, type ClientOptions } from "./client.js";
import { formatTable } from "./table.js";

const clip = (text: string, max: number) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);
const iso = (at: Timestamp | undefined) => (at === undefined ? "" : new Date(Number(at.seconds) * 1000 + Math.floor(at.nanos / 1e6)).toISOString());

/** A write whose outcome a stopped worker left unknown and nobody has settled yet. */
export interface UnresolvedWrite {
  readonly run: Run;
  readonly invocation: ToolInvocation;
}

/** Walks the waiting runs and their steps for unknown outcomes without a resolution. */
export async function findUnresolvedWrites(client: ClientOptions): Promise<UnresolvedWrite[]> {
  const runs = connect(RunService, client);
  const found: UnresolvedWrite[] = [];
  let runsPage = "";
  do {
    const page = await runs.listRuns({ status: RunStatus.WAITING, pageSize: 100, pageToken: runsPage });
    for (const run of page.runs) {
      let stepsPage = "";
      do {
        const steps = await runs.listRunSteps({ runId: run.id, pageToken: stepsPage });
        for (const step of steps.steps) {
          for (const invocation of step.toolInvocations) {
            // A step continued on the next page repeats the invocation that was cut.
            if (found.some((write) => write.invocation.id === invocation.id)) continue;
            if (invocation.status === ToolInvocationStatus.UNKNOWN_OUTCOME && invocation.resolvedOutcome === ResolvedOutcome.UNSPECIFIED) {
              found.push({ run, invocation });
            }
          }
        }
        stepsPage = steps.nextPageToken;
      } while (stepsPage !== "");
    }
    runsPage = page.nextPageToken;
  } while (runsPage !== "");
  return found;
}

/** `keel recover`: what is waiting for an operator's word, and how to give it. */
export async function recoverListCommand(client: ClientOptions, out: (line: string) => void): Promise<number> {
  const unresolved = await findUnresolvedWrites(client);
  if (unresolved.length === 0) {
    out("no runs are waiting on an unknown write outcome");
    return 0;
  }
  out(
    formatTable(
      ["RUN", "INVOCATION", "TOOL", "ARGUMENTS", "SINCE"],
      unresolved.map(({ run, invocation }) => [
        run.id,
        invocation.id,
        invocation.toolName,
        clip(invocation.argumentsJson, 60),
        iso(invocation.finishedAt ?? invocation.createdAt),
      ]),
    ),
  );
  out("");
  out("Find out whether each write took effect, then settle it (the run continues once none is left):");
  out('  keel recover RUN --invocation ID --outcome applied|not_applied --reason "what you checked"');
  return 0;
}

export interface ResolveOptions {
  readonly runId: string;
  readonly invocationId: string;
  readonly outcome: string;
  readonly actor: string;
  readonly reason: string;
}

/** `keel recover RUN --invocation ID --outcome ... --reason ...`: settles one unknown outcome. */
export async function recoverResolveCommand(client: ClientOptions, options: ResolveOptions, out: (line: string) => void): Promise<number> {
  const outcome = { applied: ResolvedOutcome.APPLIED, not_applied: ResolvedOutcome.NOT_APPLIED }[options.outcome];
  if (outcome === undefined) {
    out(`--outcome must be applied or not_applied, not ${JSON.stringify(options.outcome)}`);
    return 2;
  }
  if (options.reason.trim() === "") {
    out("--reason is required: say how you know, so the run's record and the model can tell");
    return 2;
  }
  const runs = connect(RunService, client);
  const { toolInvocation, run } = await runs.resolveUnknownOutcome({
    runId: options.runId,
    toolInvocationId: options.invocationId,
    outcome,
    actor: { id: options.actor },
    reason: options.reason,
  });
  const resolved = toolInvocation === undefined ? options.outcome : (fromEnum(ResolvedOutcomeSchema, toolInvocation.resolvedOutcome) ?? "?");
  out(`invocation ${options.invocationId} (${toolInvocation?.toolName ?? "?"}) resolved as ${resolved} by ${options.actor}`);
  out(`run ${options.runId} is ${run === undefined ? "?" : (fromEnum(RunStatusSchema, run.status) ?? "?")}`);
  return 0;
}
