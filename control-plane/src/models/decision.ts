import type { ModelSpec } from "../domain/agent.js";
import type { ModelProvider } from "./model-provider.js";

/** A fixed-choice question with the answer to use when the decision model cannot give one. */
export interface DecisionQuestion<Choice extends string> {
  readonly question: string;
  readonly choices: readonly Choice[];
  /** Documented per question: what happens when the model is slow, fails or answers off the list. */
  readonly fallback: Choice;
  readonly timeoutMs: number;
}

export interface Decision<Choice extends string> {
  readonly choice: Choice;
  /** Why the fallback was used, when it was. */
  readonly fellBack: string | undefined;
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
  try {
    const answer = await Promise.race([
      provider.decide({ spec, question: question.question, choices: question.choices, signal: AbortSignal.any([signal, timeout]) }),
      new Promise<never>((_, reject) => timeout.addEventListener("abort", () => reject(new Error(`no answer within ${question.timeoutMs} ms`)), { once: true })),
    ]);
    const choice = question.choices.find((c) => c === answer);
    if (choice === undefined) return { choice: question.fallback, fellBack: `answer ${JSON.stringify(answer)} is not one of the choices` };
    return { choice, fellBack: undefined };
  } catch (error) {
    return { choice: question.fallback, fellBack: error instanceof Error ? error.message : String(error) };
  }
}
