// The fast model's line for a cadence notice that has no checkpoint: one bounded call with typed
// output, recorded as a side model call (purpose "progress") and counted in the run's budgets.
// Anything slow, failing or off-schema leaves the facts the ledger gave: the model only makes a
// notice read better, the notice does not depend on it.
import type { Logger } from "pino";
import { z } from "zod";
import type { AgentSpec, ModelProviderName } from "../domain/agent.js";
import { MAX_PROGRESS_TEXT_CHARS } from "../domain/progress.js";
import type { ModelMessage, TokenUsage } from "../domain/transcript.js";
import { hasFastModel } from "../domain/triage.js";
import { sideCall, type SideCallLedger } from "../conversation/side-calls.js";
import type { ModelProvider } from "../models/model-provider.js";
import type { TriageCall } from "../models/triage.js";

/** The bound on a summary: a notice is late by this much at most. */
export const SUMMARY_TIMEOUT_MS = 3_000;

const answerSchema = z.object({ summary: z.string().trim().min(1).max(MAX_PROGRESS_TEXT_CHARS) });

const INSTRUCTION = [
  "People are waiting for an agent's work. Write one short progress line for them from the facts given.",
  'Answer with one JSON object and nothing else: {"summary": string}, at most 200 characters.',
  "Say only what the facts support; promise nothing; no greetings.",
].join("\n");

export interface SummaryInput {
  readonly runId: string;
  readonly agent: AgentSpec;
  readonly requestText: string;
  /** The facts the notice would say without the model ("running sandbox.exec.v1 for 2 min"). */
  readonly facts: string;
  /** Distinct per notice of a run, so a scripted model can script each. */
  readonly callIndex: number;
}

export interface ProgressSummarizer {
  /** The model's line, or undefined (no fast model, slow, failing, off-schema): then the facts are said. */
  summarize(input: SummaryInput, signal: AbortSignal): Promise<string | undefined>;
}

export function parseSummary(text: string): string | undefined {
  const start = text.indexOf("{");
  const end = text.lastIndexOf("}");
  if (start < 0 || end < start) return undefined;
  try {
    const parsed = answerSchema.safeParse(JSON.parse(text.slice(start, end + 1)));
    return parsed.success ? parsed.data.summary : undefined;
  } catch {
    return undefined;
  }
}

export function createProgressSummarizer(deps: {
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly ledger: SideCallLedger;
  readonly log: Logger;
  readonly timeoutMs?: number;
}): ProgressSummarizer {
  return {
    async summarize(input, signal) {
      if (!hasFastModel(input.agent)) return undefined;
      const spec = input.agent.models.fast;
      const timeoutMs = Math.min(deps.timeoutMs ?? SUMMARY_TIMEOUT_MS, spec.timeoutMs > 0 ? spec.timeoutMs : SUMMARY_TIMEOUT_MS);
      const messages: ModelMessage[] = [
        { role: "system", content: INSTRUCTION },
        { role: "user", content: `Request:\n${input.requestText.slice(0, 4_000)}\n\nFacts now:\n${input.facts}` },
      ];
      const bound = AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]);
      const startedAt = performance.now();
      const none: TokenUsage = { inputTokens: 0, outputTokens: 0 };
      let call: TriageCall;
      let summary: string | undefined;
      try {
        const turn = await new Promise<Awaited<ReturnType<ModelProvider["complete"]>>>((resolve, reject) => {
          bound.addEventListener("abort", () => reject(new Error(`no answer within ${timeoutMs} ms`)), { once: true });
          deps.providers[spec.provider].complete({ spec, messages, tools: [], callIndex: input.callIndex, signal: bound }).then(resolve, reject);
        });
        summary = parseSummary(turn.text);
        call = { request: { messages }, responseText: turn.text, usage: turn.usage, latencyMs: Math.round(performance.now() - startedAt), finishReason: summary === undefined ? "off_schema" : "stop" };
      } catch (error) {
        const timedOut = bound.aborted && !signal.aborted;
        deps.log.debug({ err: error, runId: input.runId }, "progress summary fell back to the facts");
        call = { request: { messages }, responseText: "", usage: none, latencyMs: Math.round(performance.now() - startedAt), finishReason: timedOut ? "timeout" : "error" };
      }
      // Recorded whatever came of it: a call made is a call counted.
      await deps.ledger.recordSideCall(sideCall(input.runId, spec, "fast", "progress", call)).catch((error: unknown) => {
        deps.log.warn({ err: error, runId: input.runId }, "progress summary call could not be recorded");
      });
      return summary;
    },
  };
}
