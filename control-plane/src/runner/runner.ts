import { randomUUID } from "node:crypto";
import type { ModelProviderName, ModelSpec } from "../domain/agent.js";
import { DEFAULT_MODEL_TIMEOUT_MS } from "../domain/agent.js";
import { DomainError } from "../domain/errors.js";
import type { EmissionDraft } from "../domain/records.js";
import { costMicroUsd, type RunStatus, type RunUsage } from "../domain/run.js";
import type { ModelMessage } from "../domain/transcript.js";
import type { ModelProvider } from "./model-provider.js";
import type { ClaimedRun, RunStore, StepCommit } from "./run-store.js";

export interface RunnerDeps {
  readonly store: RunStore;
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly now: () => Date;
}

export interface StepContext {
  readonly workerId: string;
  readonly signal: AbortSignal;
}

export const SUCCEEDED_ACK = "✅";
export const FAILED_ACK = "❌";

/**
 * Takes one claimed run through its next iteration and commits it. The first slice is
 * one model call without tools; the durable loop grows from here.
 */
export async function advanceRun(deps: RunnerDeps, run: ClaimedRun, context: StepContext): Promise<void> {
  if (run.cancelRequestedByActorId !== undefined) {
    await deps.store.commitStep(settle(run, context, "cancelled", run.usage, { summary: `cancelled by ${run.cancelRequestedByActorId}` }));
    return;
  }
  const spec = run.agent.models.primary;
  const provider = deps.providers[spec.provider];
  const messages = transcriptOf(run);
  const startedAt = deps.now();
  const timeout = AbortSignal.timeout(spec.timeoutMs > 0 ? spec.timeoutMs : DEFAULT_MODEL_TIMEOUT_MS);
  const signal = AbortSignal.any([context.signal, timeout]);
  let turn;
  try {
    turn = await provider.complete({ spec, messages, tools: [], callIndex: run.usage.modelCalls, signal });
  } catch (error) {
    if (context.signal.aborted) throw error; // shutting down: leave the run to the next claim
    if (!(error instanceof DomainError)) throw error;
    const usage = { ...run.usage, modelCalls: run.usage.modelCalls + 1, wallClockMs: elapsed(run, deps) };
    await deps.store.commitStep(
      settle(run, context, "failed", usage, {
        summary: `model call failed: ${error.message}`,
        error: error.message,
        replyText: `Sorry, I could not finish this: the model call failed (${error.message}).`,
      }),
    );
    return;
  }
  const latencyMs = deps.now().getTime() - startedAt.getTime();
  const cost = costMicroUsd(turn.usage, spec.prices);
  const usage: RunUsage = {
    ...run.usage,
    iterations: run.usage.iterations + 1,
    modelCalls: run.usage.modelCalls + 1,
    inputTokens: run.usage.inputTokens + turn.usage.inputTokens,
    outputTokens: run.usage.outputTokens + turn.usage.outputTokens,
    outputBytes: run.usage.outputBytes + Buffer.byteLength(turn.text),
    costMicroUsd: run.usage.costMicroUsd + cost,
    wallClockMs: elapsed(run, deps),
  };
  const commit = settle(run, context, "succeeded", usage, { summary: "replied", replyText: turn.text, finalReply: turn.text });
  await deps.store.commitStep({
    ...commit,
    step: {
      id: randomUUID(),
      index: run.stepCount,
      replayability: "replayable",
      actorId: run.requestedByActorId,
      startedAt,
      modelCall: {
        id: randomUUID(),
        role: "primary",
        provider: spec.provider,
        model: modelName(spec),
        request: { messages, tools: [] },
        responseText: turn.text,
        toolCalls: turn.toolCalls,
        inputTokens: turn.usage.inputTokens,
        outputTokens: turn.usage.outputTokens,
        latencyMs,
        finishReason: turn.finishReason,
        costMicroUsd: cost,
      },
    },
  });
}

function transcriptOf(run: ClaimedRun): ModelMessage[] {
  const messages: ModelMessage[] = [];
  if (run.agent.systemPrompt !== "") messages.push({ role: "system", content: run.agent.systemPrompt });
  for (const message of run.messages) messages.push({ role: "user", content: message.text, actorId: message.actorId });
  return messages;
}

function settle(
  run: ClaimedRun,
  context: StepContext,
  status: RunStatus,
  usage: RunUsage,
  outcome: { summary: string; replyText?: string; finalReply?: string; error?: string },
): StepCommit {
  const addressed = [...new Set(run.messages.map((m) => m.actorId))];
  const emissions: EmissionDraft[] = [];
  if (outcome.replyText !== undefined) {
    emissions.push({
      kind: "reply",
      idempotencyKey: `reply:${run.runId}`,
      text: outcome.replyText,
      ...(run.replyToMessageId === undefined ? {} : { replyToMessageId: run.replyToMessageId }),
      addressedActorIds: addressed,
    });
  }
  emissions.push({
    kind: "ack",
    idempotencyKey: `ack:${run.runId}:settled`,
    text: status === "succeeded" ? SUCCEEDED_ACK : FAILED_ACK,
    ackState: status === "succeeded" ? "succeeded" : "failed",
    ...(run.replyToMessageId === undefined ? {} : { replyToMessageId: run.replyToMessageId }),
    addressedActorIds: addressed,
  });
  return {
    runId: run.runId,
    workerId: context.workerId,
    epoch: run.epoch,
    step: undefined,
    status,
    usage,
    emissions,
    summary: outcome.summary,
    ...(outcome.finalReply === undefined ? {} : { finalReply: outcome.finalReply }),
    ...(outcome.error === undefined ? {} : { error: outcome.error }),
  };
}

function elapsed(run: ClaimedRun, deps: RunnerDeps): number {
  return Math.max(0, deps.now().getTime() - run.startedAt.getTime());
}

function modelName(spec: ModelSpec): string {
  return spec.model === "" ? spec.provider : spec.model;
}
