// Triage of a root run by the agent's fast model: one call, typed output. The answer is parsed
// against a zod schema; anything slow, failing or off-schema yields the defaults with the reason,
// so a bad classifier can never change more than the progress notices it was asked about.
import { z } from "zod";
import type { ModelSpec } from "../domain/agent.js";
import { DEFAULT_TRIAGE, MAX_ACK_TEXT_CHARS, triageTimeoutMs, type Triage, type TriageOutcome } from "../domain/triage.js";
import type { ModelMessage, TokenUsage } from "../domain/transcript.js";
import type { DecisionCall } from "./decision.js";
import type { ModelProvider } from "./model-provider.js";

/** What the fast model must answer: JSON, nothing else. */
export const triageAnswerSchema = z.object({
  duration: z.enum(["long", "trivial", "default"]),
  shape: z.enum(["loop", "graph_candidate"]),
  ack_text: z.string().trim().max(MAX_ACK_TEXT_CHARS).optional().nullable(),
});

const INSTRUCTION = [
  "You triage a request an agent is about to work on. Answer with one JSON object and nothing else:",
  '{"duration": "long" | "trivial" | "default", "shape": "loop" | "graph_candidate", "ack_text": string | null}.',
  "duration: long when the work will obviously take minutes; trivial when it is a quick answer; default otherwise.",
  "shape: graph_candidate only when the work plainly splits into independent parts; loop otherwise.",
  "ack_text: for long work, one short sentence telling the requester the agent is on it; otherwise null.",
].join("\n");

export interface TriageCall extends Omit<DecisionCall, "request"> {
  readonly request: { readonly messages: readonly ModelMessage[] };
}

export interface TriageResult extends TriageOutcome {
  readonly call: TriageCall;
}

/** Parses a model's answer (tolerating prose or a code fence around the object) against the schema. */
export function parseTriage(text: string): Triage | string {
  const start = text.indexOf("{");
  const end = text.lastIndexOf("}");
  if (start < 0 || end < start) return "the answer holds no JSON object";
  let json: unknown;
  try {
    json = JSON.parse(text.slice(start, end + 1));
  } catch (error) {
    return `the answer is not JSON (${(error as Error).message})`;
  }
  const parsed = triageAnswerSchema.safeParse(json);
  if (!parsed.success) return `the answer is off-schema: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(answer)"} ${i.message}`).join("; ")}`;
  const ackText = parsed.data.ack_text ?? "";
  return { duration: parsed.data.duration, shape: parsed.data.shape, ackText: ackText === "" ? undefined : ackText };
}

/**
 * One bounded fast-model call. Never throws: the outcome is the model's triage or the defaults
 * with the reason, and the call is described for the ledger either way.
 */
export async function triageRequest(provider: ModelProvider, spec: ModelSpec, requestText: string, signal: AbortSignal): Promise<TriageResult> {
  const messages: ModelMessage[] = [
    { role: "system", content: INSTRUCTION },
    { role: "user", content: requestText },
  ];
  const timeoutMs = triageTimeoutMs(spec.timeoutMs);
  const controller = new AbortController();
  const stop = (): void => controller.abort(signal.reason);
  signal.addEventListener("abort", stop, { once: true });
  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  const startedAt = performance.now();
  const call = (responseText: string, usage: TokenUsage, finishReason: DecisionCall["finishReason"]): TriageCall => ({
    request: { messages },
    responseText,
    usage,
    latencyMs: Math.round(performance.now() - startedAt),
    finishReason,
  });
  const none: TokenUsage = { inputTokens: 0, outputTokens: 0 };
  try {
    const turn = await Promise.race([
      provider.complete({ spec, messages, tools: [], callIndex: 0, signal: controller.signal }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          timedOut = true;
          controller.abort(new DOMException("triage timed out", "TimeoutError"));
          reject(new Error(`no answer within ${timeoutMs} ms`));
        }, timeoutMs);
      }),
    ]);
    const parsed = parseTriage(turn.text);
    if (typeof parsed === "string") return { triage: DEFAULT_TRIAGE, fellBack: parsed, call: call(turn.text, turn.usage, "off_schema") };
    return { triage: parsed, fellBack: undefined, call: call(turn.text, turn.usage, "stop") };
  } catch (error) {
    const reason = timedOut ? `no answer within ${timeoutMs} ms` : error instanceof Error ? error.message : String(error);
    return { triage: DEFAULT_TRIAGE, fellBack: reason, call: call("", none, timedOut ? "timeout" : "error") };
  } finally {
    clearTimeout(timer);
    signal.removeEventListener("abort", stop);
  }
}
