// Rebuilds what the model sees from the committed steps, so a resumed run continues
// from the ledger and never from memory. Every tool call gets exactly one result.
import type { ToolInvocationStatus } from "./records.js";
import type { ModelMessage, ToolCallRequest } from "./transcript.js";

export interface TranscriptInvocation {
  readonly providerCallId: string;
  readonly toolName: string;
  readonly status: ToolInvocationStatus;
  readonly resultText: string | undefined;
  readonly refusalReason: string | undefined;
  readonly resolvedOutcome: "applied" | "not_applied" | undefined;
  readonly resolvedByActorId: string | undefined;
  readonly resolutionReason: string | undefined;
}

export interface TranscriptStep {
  readonly responseText: string;
  readonly toolCalls: readonly ToolCallRequest[];
  readonly invocations: readonly TranscriptInvocation[];
  readonly feedback: string | undefined;
}

export interface TranscriptInput {
  readonly systemPrompt: string;
  readonly requests: readonly { readonly actorId: string; readonly text: string }[];
  readonly steps: readonly TranscriptStep[];
}

/** The text the model sees as one call's result, synthetic where the call never finished. */
export function toolResultText(invocation: TranscriptInvocation | undefined): string {
  if (invocation === undefined) return "Not executed: the call was not recorded.";
  switch (invocation.status) {
    case "succeeded":
    case "failed":
      return invocation.resultText ?? "";
    case "refused":
      return `Refused: ${invocation.refusalReason ?? "no reason recorded"}`;
    case "interrupted":
      return "Interrupted: the worker running this read stopped before it finished, and nothing was recorded. Call the tool again if you still need the result.";
    case "unknown_outcome":
      if (invocation.resolvedOutcome === undefined) {
        return "Outcome unknown: the worker stopped while this call was in flight, so whether it took effect is not known. It was not retried.";
      }
      return (
        `Outcome was unknown after a worker stopped; ${invocation.resolvedByActorId ?? "an operator"} determined it ` +
        `${invocation.resolvedOutcome === "applied" ? "took effect" : "did not take effect"}` +
        `${invocation.resolutionReason ? `: ${invocation.resolutionReason}` : "."}`
      );
    case "pending":
      return "Pending: no result yet.";
  }
}

export function buildTranscript(input: TranscriptInput): ModelMessage[] {
  const messages: ModelMessage[] = [];
  if (input.systemPrompt.trim() !== "") messages.push({ role: "system", content: input.systemPrompt });
  const multipleActors = new Set(input.requests.map((r) => r.actorId)).size > 1;
  for (const request of input.requests) {
    messages.push({
      role: "user",
      content: multipleActors ? `${request.actorId}: ${request.text}` : request.text,
      actorId: request.actorId,
    });
  }
  for (const step of input.steps) {
    messages.push({ role: "assistant", content: step.responseText, toolCalls: step.toolCalls });
    for (const call of step.toolCalls) {
      const invocation = step.invocations.find((i) => i.providerCallId === call.id);
      messages.push({ role: "tool", toolCallId: call.id, content: toolResultText(invocation) });
    }
    if (step.feedback !== undefined) messages.push({ role: "user", content: `[keel] ${step.feedback}` });
  }
  return messages;
}
