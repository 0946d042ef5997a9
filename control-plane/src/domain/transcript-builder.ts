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

export interface TranscriptRequest {
  readonly actorId: string;
  readonly text: string;
  /** After how many of the run's own steps the message arrived (an amendment); 0 or absent: before any. */
  readonly afterStep?: number;
  /** How the message joined: an edit or a continuation consent reads differently from a plain request. */
  readonly relation?: string;
}

/** A progress notice an earlier run of the conversation sent while it worked (progress_events). */
export interface TranscriptProgress {
  readonly text: string;
  readonly at: Date;
}

/** How many of the conversation's most recent notices a follow-up run is shown. */
export const FOLLOW_UP_PROGRESS_RECORDS = 3;

export interface TranscriptInput {
  readonly systemPrompt: string;
  readonly requests: readonly TranscriptRequest[];
  readonly steps: readonly TranscriptStep[];
  /**
   * What a superseded or exhausted predecessor was asked and completed. The model sees it
   * first, as its own earlier work, then this run's messages and steps: a restart resumes.
   */
  readonly inherited?: { readonly requests: readonly TranscriptRequest[]; readonly steps: readonly TranscriptStep[] };
  /**
   * The most recent progress notices of the conversation's earlier runs, oldest first. They are
   * shown first, labelled as progress, so the model never takes them for replies it gave.
   */
  readonly progress?: readonly TranscriptProgress[] | undefined;
  /**
   * The messages already built for each step, kept by the caller from one turn to the next. A
   * step never changes once built (settling a call replaces its step), so each turn builds only
   * the steps that are new or replaced, and hands back the same message objects for the rest:
   * comparing them with the previous request's is then a reference check, not a walk.
   */
  readonly stepMessages?: WeakMap<TranscriptStep, readonly ModelMessage[]>;
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
  const inherited = input.inherited ?? { requests: [], steps: [] };
  const multipleActors = new Set([...inherited.requests, ...input.requests].map((r) => r.actorId)).size > 1;
  const pushRequest = (request: TranscriptRequest): void => {
    const text = presented(request);
    messages.push({ role: "user", content: multipleActors ? `${request.actorId}: ${text}` : text, actorId: request.actorId });
  };
  const pushStep = (step: TranscriptStep): void => {
    let built = input.stepMessages?.get(step);
    if (built === undefined) {
      built = stepMessages(step);
      input.stepMessages?.set(step, built);
    }
    for (const message of built) messages.push(message);
  };
  const progress = (input.progress ?? []).slice(-FOLLOW_UP_PROGRESS_RECORDS);
  if (progress.length > 0) messages.push({ role: "user", content: progressContext(progress) });
  inherited.requests.forEach(pushRequest);
  inherited.steps.forEach(pushStep);
  const at = (position: number) => input.requests.filter((r) => Math.min(r.afterStep ?? 0, input.steps.length) === position);
  at(0).forEach(pushRequest);
  input.steps.forEach((step, i) => {
    pushStep(step);
    at(i + 1).forEach(pushRequest);
  });
  return messages;
}

/** A step as the model saw it: its reply and calls, each call's result, and any feedback on the turn. */
function stepMessages(step: TranscriptStep): ModelMessage[] {
  const messages: ModelMessage[] = [{ role: "assistant", content: step.responseText, toolCalls: step.toolCalls }];
  for (const call of step.toolCalls) {
    const invocation = step.invocations.find((i) => i.providerCallId === call.id);
    messages.push({ role: "tool", toolCallId: call.id, content: toolResultText(invocation) });
  }
  if (step.feedback !== undefined) messages.push({ role: "user", content: `[keel] ${step.feedback}` });
  return messages;
}

/** One labelled block: these were status updates sent while earlier work ran, not answers. */
function progressContext(progress: readonly TranscriptProgress[]): string {
  const lines = progress.map((p) => `- [progress ${p.at.toISOString()}] ${p.text}`);
  return [
    `[keel] Progress records: the ${progress.length === 1 ? "most recent progress notice" : `${progress.length} most recent progress notices`} sent in this conversation while earlier work was running, oldest first. They were status updates, not replies:`,
    ...lines,
  ].join("\n");
}

function presented(request: TranscriptRequest): string {
  switch (request.relation) {
    case "edit":
      return `(edited message) ${request.text}`;
    case "continues":
      return `[keel] The earlier run stopped when its budget ran out; ${request.actorId} replied to the question whether to continue, and a fresh budget was granted: ${request.text}`;
    default:
      return request.text;
  }
}
