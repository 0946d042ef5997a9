import { Code, ConnectError, type Client } from "@connectrpc/connect";
import {
  ArtifactProvenanceSchema,
  BudgetDimension,
  BudgetDimensionSchema,
  ExecutionShape,
  ModelRoleSchema,
  ResolvedOutcome,
  ResolvedOutcomeSchema,
  RunStatusSchema,
  ToolInvocationStatusSchema,
  VerificationConclusionSchema,
  WaitReason,
  WaitReasonSchema,
  type Run,
} from "../../../gen/keel/v1/run_pb.js";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { fromEnum } from "../api/convert.js";
import { connect, type ClientOptions } from "./client.js";
import { renderWorkGraphTree } from "./work-graph-tree.js";

const clip = (text: string, max = 200) => (text.length > max ? `${text.slice(0, max)}… (${text.length} chars)` : text);

/** A run, its steps, model calls, tokens and statuses, for a human. */
export async function inspectCommand(client: ClientOptions, runId: string, out: (line: string) => void): Promise<number> {
  const runs = connect(RunService, client);
  const { run } = await runs.getRun({ runId });
  if (run === undefined) return 1;
  const usage = run.usage;
  out(`run          ${run.id}`);
  out(`agent        ${run.agentId}   conversation ${run.conversationId}   connector ${run.connector}`);
  out(`status       ${statusLine(run)}${run.error === "" ? "" : `   error: ${run.error}`}`);
  out(`requested by ${run.requestedBy?.id ?? ""}   triggers: ${run.triggers.map((t) => `${t.messageId} (${t.actorId})`).join(", ")}`);
  out(
    `usage        ${usage?.iterations ?? 0} iterations, ${usage?.modelCalls ?? 0} model calls, ${usage?.toolCalls ?? 0} tool calls, ` +
      `${usage?.inputTokens ?? 0n} in / ${usage?.outputTokens ?? 0n} out tokens, ${usage?.costMicroUsd ?? 0n} µUSD, ${usage?.wallClockMs ?? 0n} ms`,
  );
  if (run.finalReply !== "") out(`reply        ${clip(run.finalReply)}`);
  let pageToken = "";
  // A step too big for one page comes again on the next with the rest of its output: shown once.
  const shownSteps = new Set<string>();
  const shownTools = new Set<string>();
  do {
    const page = await runs.listRunSteps({ runId, pageToken });
    for (const step of page.steps) {
      if (!shownSteps.has(step.id)) {
        shownSteps.add(step.id);
        out("");
        out(`step ${step.index}  ${step.id}  → ${fromEnum(RunStatusSchema, step.runStatusAfter) ?? "?"}  (epoch ${step.leaseEpoch})`);
      }
      const call = step.modelCall;
      if (call !== undefined) {
        out(
          `  model ${fromEnum(ModelRoleSchema, call.role) ?? "?"} ${call.provider}/${call.model}: ` +
            `${call.usage?.inputTokens ?? 0n} in, ${call.usage?.outputTokens ?? 0n} out, ${call.latencyMs} ms, finish ${call.finishReason}`,
        );
        if (call.responseText !== "") out(`  says  ${clip(call.responseText)}`);
      }
      for (const tool of step.toolInvocations) {
        if (shownTools.has(tool.id)) {
          for (const observation of tool.observations) out(`        [${observation.stream}] ${clip(observation.text)}`);
          continue;
        }
        shownTools.add(tool.id);
        out(`  tool  #${tool.ordinal} ${tool.toolName} ${clip(tool.argumentsJson, 120)} → ${fromEnum(ToolInvocationStatusSchema, tool.status) ?? "?"}`);
        if (tool.refusalReason !== "") out(`        refused: ${tool.refusalReason}`);
        if (tool.resolvedOutcome !== ResolvedOutcome.UNSPECIFIED) {
          const reason = tool.resolutionReason === "" ? "" : `: ${tool.resolutionReason}`;
          out(`        resolved: ${fromEnum(ResolvedOutcomeSchema, tool.resolvedOutcome) ?? "?"} by ${tool.resolvedByActorId}${reason}`);
        }
        for (const observation of tool.observations) out(`        [${observation.stream}] ${clip(observation.text)}`);
      }
    }
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  const { artifacts } = await runs.listArtifacts({ runId });
  if (artifacts.length > 0) {
    out("");
    out("artifacts");
    for (const artifact of artifacts) {
      const conclusion = fromEnum(VerificationConclusionSchema, artifact.conclusion);
      const data = artifact.inlineData !== "" ? clip(artifact.inlineData, 120) : artifact.reference !== "" ? `→ ${artifact.reference}` : "";
      out(
        `  ${artifact.type} v${artifact.schemaVersion}  ${fromEnum(ArtifactProvenanceSchema, artifact.provenance) ?? "?"}` +
          `${conclusion === undefined ? "" : ` ${conclusion}`}${artifact.subjectArtifactId === "" ? "" : ` of ${artifact.subjectArtifactId}`}` +
          `${artifact.toolInvocationId === "" ? "" : `  (tool call ${artifact.toolInvocationId})`}${data === "" ? "" : `  ${data}`}`,
      );
    }
  }
  if (run.shape === ExecutionShape.GRAPH || run.parentRunId !== "") await printWorkGraph(runs, run.id, out);
  return 0;
}

/** The run's WorkGraph as a tree, with each child run's spend; a child of no graph prints nothing. */
async function printWorkGraph(runs: Client<typeof RunService>, runId: string, out: (line: string) => void): Promise<void> {
  let graph;
  try {
    ({ graph } = await runs.getWorkGraph({ runId }));
  } catch (error) {
    if (ConnectError.from(error).code === Code.NotFound) return;
    throw error;
  }
  if (graph === undefined) return;
  const childIds = [...new Set(graph.nodes.flatMap((n) => n.attempts.map((a) => a.childRunId)).filter((id) => id !== ""))];
  const children = await Promise.all(childIds.map(async (id) => [id, (await runs.getRun({ runId: id })).run?.usage] as const));
  const usage = new Map(children.flatMap(([id, used]) => (used === undefined ? [] : [[id, used] as const])));
  out("");
  for (const line of renderWorkGraphTree(graph, usage, runId)) out(line);
}

/** The status with why it is where it is: paused, waiting on what, which budget ran out, who cancelled. */
function statusLine(run: Run): string {
  const notes = [
    run.paused ? "paused" : "",
    run.waitReason === WaitReason.UNSPECIFIED ? "" : `waiting on ${fromEnum(WaitReasonSchema, run.waitReason) ?? "?"}`,
    run.exhaustedDimension === BudgetDimension.UNSPECIFIED ? "" : `${fromEnum(BudgetDimensionSchema, run.exhaustedDimension) ?? "?"} budget used up`,
    run.cancelledByActorId === "" ? "" : `cancelled by ${run.cancelledByActorId}`,
  ].filter((note) => note !== "");
  const status = fromEnum(RunStatusSchema, run.status) ?? "?";
  return notes.length === 0 ? status : `${status} (${notes.join(", ")})`;
}
