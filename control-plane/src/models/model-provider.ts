import type { ModelSpec } from "../domain/agent.js";
import type { ModelMessage, ModelTurn, TokenUsage, ToolSpec } from "../domain/transcript.js";

export interface ModelRequest {
  readonly spec: ModelSpec;
  readonly messages: readonly ModelMessage[];
  readonly tools: readonly ToolSpec[];
  /** Zero-based count of model calls this run made before this one. */
  readonly callIndex: number;
  readonly signal: AbortSignal;
}

/** A fixed-choice question for the decision role. */
export interface DecisionRequest {
  readonly spec: ModelSpec;
  readonly question: string;
  readonly choices: readonly string[];
  readonly signal: AbortSignal;
  /** Told the call's token usage once the provider has an answer, so the call can be recorded and counted. */
  readonly onUsage?: (usage: TokenUsage) => void;
}

/**
 * The port to a model (the runner and the conversation mailbox use it). Implementations throw ModelProviderError for
 * provider failures (HTTP errors, timeouts, malformed output).
 */
export interface ModelProvider {
  complete(request: ModelRequest): Promise<ModelTurn>;
  /** Returns one of `choices`, or throws. Callers fall back to the question's default. */
  decide(request: DecisionRequest): Promise<string>;
}
