import type { ModelSpec } from "../domain/agent.js";
import type { TokenUsage } from "../domain/transcript.js";
import type { ModelProvider } from "./model-provider.js";

/** A fixed-choice question with the answer to use when the decision model cannot give one. */
export interface DecisionQuestion<Choice extends string> {
  readonly question: string;
  readonly choices: readonly Choice[];
  /** Documented per question: what happens when the model is slow, fails or answers off the list. */
  readonly fallback: Choice;
  readonly timeoutMs: number;
}

/** The call behind a decision, for the ledger: what was asked, what came back, what it used. */
export interface DecisionCall {
  readonly request: { readonly question: string; readonly choices: readonly string[] };
  readonly responseText: string;
  readonly usage: TokenUsage;
  readonly latencyMs: number;
  /** stop for an answer on the list; otherwise why the fallback was used (timeout, error, off_schema). */
  readonly finishReason: "stop" | "timeout" | "error" | "off_schema";
}

export interface Decision<Choice extends string> {
  readonly choice: Choice;
  /** Why the fallback was used, when it was. */
  readonly fellBack: string | undefined;
  readonly call: DecisionCall;
}

/**
 * Asks the decision role. Never throws: a failed, slow or malformed answer yields the
 * question's fallback, so a flaky classifier can only make Keel more conservative.
 */
export async function decide<Choice extends string>(
  provider: ModelProvider,
  spec: ModelSpec,
  question: DecisionQuestion<Choice>,
  signal: AbortSignal,
): Promise<Decision<Choice>> {
  const timeout = AbortSignal.timeout(question.timeoutMs);
  const startedAt = performance.now();
  let usage: TokenUsage = { inputTokens: 0, outputTokens: 0 };
  const call = (responseText: string, finishReason: DecisionCall["finishReason"]): DecisionCall => ({
    request: { question: question.question, choices: question.choices },
    responseText,
    usage,
    latencyMs: Math.round(performance.now() - startedAt),
    finishReason,
  });
  let timedOut = false;
  try {
    const answer = await Promise.race([
      provider.decide({
        spec,
        question: question.question,
        choices: question.choices,
        signal: AbortSignal.any([signal, timeout]),
        onUsage: (reported) => (usage = reported),
      }),
      new Promise<never>((_, reject) =>
        timeout.addEventListener(
          "abort",
          () => {
            timedOut = true;
            reject(new Error(`no answer within ${question.timeoutMs} ms`));
          },
          { once: true },
        ),
      ),
    ]);
    const choice = question.choices.find((c) => c === answer);
    if (choice === undefined) {
      return { choice: question.fallback, fellBack: `answer ${JSON.stringify(answer)} is not one of the choices`, call: call(answer, "off_schema") };
    }
    return { choice, fellBack: undefined, call: call(answer, "stop") };
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    return { choice: question.fallback, fellBack: reason, call: call("", timedOut ? "timeout" : "error") };
  }
}
