// The ModelProvider for OpenAI and every server that speaks its chat-completions API
// (vLLM, llama.cpp, Ollama, LM Studio, ...), through the official SDK.

import OpenAI, { APIConnectionTimeoutError, APIError, APIUserAbortError } from "openai";
import type {
  ChatCompletion,
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionMessageParam,
  ChatCompletionMessageToolCall,
  ChatCompletionTool,
} from "openai/resources/chat/completions";
import { z } from "zod";
import { DEFAULT_MODEL_TIMEOUT_MS, type ModelSpec } from "../domain/agent.js";
import { ModelProviderError } from "../domain/errors.js";
import type { ModelMessage, ModelTurn, ToolCallRequest, ToolSpec } from "../domain/transcript.js";
import type { DecisionRequest, ModelProvider, ModelRequest } from "./model-provider.js";

export interface OpenAiModelProviderOptions {
  /** Where API keys are read from, by the name in `ModelSpec.apiKeyEnv`. */
  readonly env: Readonly<Record<string, string | undefined>>;
}

/** Local servers want no key, but the SDK refuses to run without one. */
const NO_KEY_PLACEHOLDER = "unused";

/** OpenAI's limit on function names. */
const MAX_TOOL_NAME_LENGTH = 64;

const DECISION_INSTRUCTION =
  "Answer the question by choosing exactly one of the allowed answers. Reply only with the JSON object.";

export function createOpenAiModelProvider(options: OpenAiModelProviderOptions): ModelProvider {
  const clients = new Map<string, OpenAI>();

  // One client per endpoint and key keeps connection pools warm across calls and runs.
  const clientFor = (spec: ModelSpec): { client: OpenAI; apiKey: string } => {
    const apiKey = resolveApiKey(spec, options.env);
    const cacheKey = `${spec.endpoint}\u0000${apiKey}`;
    let client = clients.get(cacheKey);
    if (client === undefined) {
      client = new OpenAI({
        baseURL: spec.endpoint,
        apiKey,
        timeout: timeoutOf(spec),
        maxRetries: 0,
        // Only the spec decides where calls go and as whom: ignore ambient OPENAI_* variables.
        organization: null,
        project: null,
        adminAPIKey: null,
        webhookSecret: null,
      });
      clients.set(cacheKey, client);
    }
    return { client, apiKey };
  };

  return {
    async complete(request: ModelRequest): Promise<ModelTurn> {
      const { client, apiKey } = clientFor(request.spec);
      const body: ChatCompletionCreateParamsNonStreaming = {
        model: request.spec.model,
        messages: request.messages.map(toWireMessage),
      };
      if (request.tools.length > 0) body.tools = request.tools.map(toWireTool);
      const completion = await call(apiKey, request.signal, () =>
        client.chat.completions.create(body, { signal: request.signal, timeout: timeoutOf(request.spec) }),
      );
      return toModelTurn(completion, request.tools);
    },

    async decide(request: DecisionRequest): Promise<string> {
      if (request.choices.length === 0) throw new ModelProviderError("decision has no choices");
      const { client, apiKey } = clientFor(request.spec);
      const completion = await call(apiKey, request.signal, () =>
        client.chat.completions.create(
          {
            model: request.spec.model,
            messages: [
              { role: "system", content: DECISION_INSTRUCTION },
              { role: "user", content: request.question },
            ],
            response_format: {
              type: "json_schema",
              json_schema: {
                name: "decision",
                strict: true,
                schema: {
                  type: "object",
                  properties: { answer: { type: "string", enum: [...request.choices] } },
                  required: ["answer"],
                  additionalProperties: false,
                },
              },
            },
          },
          { signal: request.signal, timeout: timeoutOf(request.spec) },
        ),
      );
      request.onUsage?.({ inputTokens: completion.usage?.prompt_tokens ?? 0, outputTokens: completion.usage?.completion_tokens ?? 0 });
      return parseDecision(completion, request.choices);
    },
  };
}

/**
 * Keel tool names (`sandbox.exec.v1`) hold dots, which OpenAI function names may not.
 * "." becomes "__"; names that would not decode back unambiguously are refused.
 */
export function encodeToolName(name: string): string {
  const encodable =
    /^[a-zA-Z0-9_.-]+$/.test(name) && !name.includes("__") && !name.includes("_.") && !name.includes("._");
  const encoded = name.replaceAll(".", "__");
  if (!encodable || encoded.length > MAX_TOOL_NAME_LENGTH) {
    throw new ModelProviderError(`tool name ${JSON.stringify(name)} cannot be sent to an OpenAI-compatible model`);
  }
  return encoded;
}

export function decodeToolName(wireName: string): string {
  return wireName.replaceAll("__", ".");
}

function resolveApiKey(spec: ModelSpec, env: Readonly<Record<string, string | undefined>>): string {
  if (spec.apiKeyEnv === "") return NO_KEY_PLACEHOLDER;
  const value = env[spec.apiKeyEnv];
  if (value === undefined || value === "") {
    throw new ModelProviderError(`API key variable ${spec.apiKeyEnv} is not set`);
  }
  return value;
}

/** A zero timeout in a spec means "the default", never "wait forever". */
function timeoutOf(spec: ModelSpec): number {
  return spec.timeoutMs > 0 ? spec.timeoutMs : DEFAULT_MODEL_TIMEOUT_MS;
}

function toWireMessage(message: ModelMessage): ChatCompletionMessageParam {
  switch (message.role) {
    case "system":
      return { role: "system", content: message.content };
    case "user":
      return { role: "user", content: message.content };
    case "assistant":
      if (message.toolCalls.length === 0) return { role: "assistant", content: message.content };
      return {
        role: "assistant",
        // OpenAI's own convention for a turn that only calls tools.
        content: message.content === "" ? null : message.content,
        tool_calls: message.toolCalls.map((call) => ({
          id: call.id,
          type: "function",
          function: { name: encodeToolName(call.name), arguments: call.argumentsJson },
        })),
      };
    case "tool":
      return { role: "tool", tool_call_id: message.toolCallId, content: message.content };
  }
}

function toWireTool(tool: ToolSpec): ChatCompletionTool {
  return {
    type: "function",
    function: { name: encodeToolName(tool.name), description: tool.description, parameters: { ...tool.parametersJsonSchema } },
  };
}

/** Runs an SDK call, turning every failure into a ModelProviderError the runner understands. */
async function call<T>(apiKey: string, signal: AbortSignal, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (error) {
    throw toProviderError(error, apiKey, signal);
  }
}

function toProviderError(error: unknown, apiKey: string, signal: AbortSignal): ModelProviderError {
  if (error instanceof ModelProviderError) return error;
  if (error instanceof APIUserAbortError || signal.aborted) {
    return new ModelProviderError("model call aborted", { cause: signal.reason });
  }
  if (error instanceof APIConnectionTimeoutError) return new ModelProviderError("model call timed out");
  const detail = error instanceof APIError && error.status !== undefined ? `HTTP ${error.status}: ` : "";
  const message = error instanceof Error ? error.message : String(error);
  return new ModelProviderError(`model call failed: ${detail}${redact(message, apiKey)}`);
}

/** Servers sometimes echo the request back in errors; the key must never reach logs or runs. */
function redact(message: string, apiKey: string): string {
  const scrubbed = apiKey === NO_KEY_PLACEHOLDER ? message : message.split(apiKey).join("[redacted]");
  return scrubbed.length > 300 ? `${scrubbed.slice(0, 300)}…` : scrubbed;
}

function firstChoice(completion: ChatCompletion): ChatCompletion.Choice {
  // Bodies from OpenAI-compatible servers are not checked by the SDK, so trust no field.
  const choice = (completion as { choices?: ChatCompletion.Choice[] | null }).choices?.[0];
  if (choice?.message === undefined || choice.message === null) {
    throw new ModelProviderError("model response has no choices");
  }
  return choice;
}

function toModelTurn(completion: ChatCompletion, tools: readonly ToolSpec[]): ModelTurn {
  const choice = firstChoice(completion);
  // Map back through the advertised tools first; decoding is the fallback for unknown names.
  const byWireName = new Map(tools.map((tool) => [encodeToolName(tool.name), tool.name]));
  const toolCalls = (choice.message.tool_calls ?? []).map((toolCall) => toToolCallRequest(toolCall, byWireName));
  return {
    text: choice.message.content ?? "",
    toolCalls,
    usage: {
      inputTokens: completion.usage?.prompt_tokens ?? 0,
      outputTokens: completion.usage?.completion_tokens ?? 0,
    },
    finishReason: choice.finish_reason ?? (toolCalls.length > 0 ? "tool_calls" : "stop"),
  };
}

function toToolCallRequest(
  toolCall: ChatCompletionMessageToolCall,
  byWireName: ReadonlyMap<string, string>,
): ToolCallRequest {
  if (toolCall.type !== "function") {
    throw new ModelProviderError(`model returned an unsupported ${JSON.stringify(toolCall.type)} tool call`);
  }
  const wireName = toolCall.function.name;
  return {
    id: toolCall.id,
    name: byWireName.get(wireName) ?? decodeToolName(wireName),
    argumentsJson: toolCall.function.arguments,
  };
}

function parseDecision(completion: ChatCompletion, choices: readonly string[]): string {
  const content = firstChoice(completion).message.content;
  if (content === null || content === "") throw new ModelProviderError("decision model returned no content");
  let parsed: unknown;
  try {
    parsed = JSON.parse(content);
  } catch {
    throw new ModelProviderError("decision model returned malformed JSON");
  }
  const schema = z.object({
    answer: z.string().refine((answer) => choices.includes(answer), "answer is not one of the choices"),
  });
  const result = schema.safeParse(parsed);
  if (!result.success) throw new ModelProviderError("decision model answered outside the allowed choices");
  return result.data.answer;
}
