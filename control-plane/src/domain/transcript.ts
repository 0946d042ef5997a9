// What a model sees and says, in Keel's terms; providers translate to their wire formats.

export interface ToolCallRequest {
  /** The provider's id for the call, echoed back on the tool result. */
  readonly id: string;
  readonly name: string;
  readonly argumentsJson: string;
}

export type ModelMessage =
  | { readonly role: "system"; readonly content: string }
  | { readonly role: "user"; readonly content: string; readonly actorId?: string }
  | { readonly role: "assistant"; readonly content: string; readonly toolCalls: readonly ToolCallRequest[] }
  | { readonly role: "tool"; readonly toolCallId: string; readonly content: string };

/** A tool as advertised to the model. */
export interface ToolSpec {
  readonly name: string;
  readonly description: string;
  readonly parametersJsonSchema: Readonly<Record<string, unknown>>;
}

export interface TokenUsage {
  readonly inputTokens: number;
  readonly outputTokens: number;
}

export interface ModelTurn {
  readonly text: string;
  readonly toolCalls: readonly ToolCallRequest[];
  readonly usage: TokenUsage;
  readonly finishReason: string;
}
