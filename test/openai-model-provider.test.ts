import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { ModelSpec } from "../control-plane/src/domain/agent.js";
import { ModelProviderError } from "../control-plane/src/domain/errors.js";
import type { ModelMessage, ToolSpec } from "../control-plane/src/domain/transcript.js";
import {
  createOpenAiModelProvider,
  decodeToolName,
  encodeToolName,
} from "../control-plane/src/models/openai-model-provider.js";
import type { ModelProvider } from "../control-plane/src/models/model-provider.js";
import {
  startOpenAiCompatibleServer,
  type CompletionScript,
  type OpenAiCompatibleServer,
  type OpenAiCompatibleServerOptions,
} from "./support/openai-compatible-server.js";

const servers: OpenAiCompatibleServer[] = [];

afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

async function serve(script: CompletionScript, options?: OpenAiCompatibleServerOptions): Promise<OpenAiCompatibleServer> {
  const server = await startOpenAiCompatibleServer(script, options);
  servers.push(server);
  return server;
}

function spec(server: OpenAiCompatibleServer, overrides: Partial<ModelSpec> = {}): ModelSpec {
  return {
    provider: "openai",
    model: "test-model",
    endpoint: server.url,
    apiKeyEnv: "",
    prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
    scriptedTurns: [],
    timeoutMs: 5_000,
    ...overrides,
  };
}

const noSignal = (): AbortSignal => new AbortController().signal;

function complete(
  provider: ModelProvider,
  modelSpec: ModelSpec,
  messages: readonly ModelMessage[] = [{ role: "user", content: "hello" }],
  tools: readonly ToolSpec[] = [],
  signal: AbortSignal = noSignal(),
): ReturnType<ModelProvider["complete"]> {
  return provider.complete({ spec: modelSpec, messages, tools, callIndex: 0, signal });
}

async function expectProviderError(promise: Promise<unknown>): Promise<ModelProviderError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ModelProviderError);
  return error as ModelProviderError;
}

const execTool: ToolSpec = {
  name: "sandbox.exec.v1",
  description: "Run a command in the sandbox",
  parametersJsonSchema: {
    type: "object",
    properties: { cmd: { type: "string" } },
    required: ["cmd"],
    additionalProperties: false,
  },
};
const askTool: ToolSpec = {
  name: "keel.ask_user.v1",
  description: "Ask the user a question",
  parametersJsonSchema: { type: "object", properties: { question: { type: "string" } }, required: ["question"] },
};

describe("tool name encoding", () => {
  it("round-trips Keel tool names through OpenAI-legal names", () => {
    for (const name of ["sandbox.exec.v1", "keel.ask_user.v1", "a-b.c_d.v2", "plain"]) {
      const wire = encodeToolName(name);
      expect(wire).toMatch(/^[a-zA-Z0-9_-]+$/);
      expect(decodeToolName(wire)).toBe(name);
    }
    expect(encodeToolName("sandbox.exec.v1")).toBe("sandbox__exec__v1");
  });

  it("refuses names that would not decode unambiguously or are too long", () => {
    for (const name of ["a__b", "a_.b", "a._b", "has space", "x".repeat(65)]) {
      expect(() => encodeToolName(name)).toThrow(ModelProviderError);
    }
  });
});

describe("OpenAI model provider over HTTP", () => {
  it("returns a text reply with usage and finish reason", async () => {
    const server = await serve(() => ({ kind: "reply", text: "Hi there", usage: { promptTokens: 11, completionTokens: 3 } }));
    const provider = createOpenAiModelProvider({ env: {} });

    const turn = await complete(provider, spec(server), [
      { role: "system", content: "be brief" },
      { role: "user", content: "hello", actorId: "u1" },
    ]);

    expect(turn).toEqual({ text: "Hi there", toolCalls: [], usage: { inputTokens: 11, outputTokens: 3 }, finishReason: "stop" });
    const sent = server.requests[0];
    expect(sent?.model).toBe("test-model");
    expect(sent?.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "hello" },
    ]);
    expect(sent).not.toHaveProperty("tools");
    expect(sent?.stream).toBeFalsy();
  });

  it("reports zero usage when the server sends none", async () => {
    const server = await serve(() => ({ kind: "reply", text: "ok", usage: null }));
    const turn = await complete(createOpenAiModelProvider({ env: {} }), spec(server));
    expect(turn.usage).toEqual({ inputTokens: 0, outputTokens: 0 });
  });

  it("sends tools and tool results, and decodes the tool names the model calls", async () => {
    const server = await serve(() => ({
      kind: "reply",
      text: null,
      toolCalls: [
        { id: "call_a", name: "sandbox__exec__v1", arguments: '{"cmd":"ls -la"}' },
        { id: "call_b", name: "keel__ask_user__v1", arguments: '{"question":"ok?"}' },
      ],
      usage: { promptTokens: 40, completionTokens: 12 },
    }));
    const provider = createOpenAiModelProvider({ env: {} });
    const history: ModelMessage[] = [
      { role: "user", content: "list files" },
      { role: "assistant", content: "", toolCalls: [{ id: "call_0", name: "sandbox.exec.v1", argumentsJson: '{"cmd":"pwd"}' }] },
      { role: "tool", toolCallId: "call_0", content: "/workspace" },
    ];

    const turn = await complete(provider, spec(server), history, [execTool, askTool]);

    expect(turn).toEqual({
      text: "",
      toolCalls: [
        { id: "call_a", name: "sandbox.exec.v1", argumentsJson: '{"cmd":"ls -la"}' },
        { id: "call_b", name: "keel.ask_user.v1", argumentsJson: '{"question":"ok?"}' },
      ],
      usage: { inputTokens: 40, outputTokens: 12 },
      finishReason: "tool_calls",
    });
    const sent = server.requests[0];
    expect(sent?.tools).toEqual([
      {
        type: "function",
        function: { name: "sandbox__exec__v1", description: execTool.description, parameters: execTool.parametersJsonSchema },
      },
      {
        type: "function",
        function: { name: "keel__ask_user__v1", description: askTool.description, parameters: askTool.parametersJsonSchema },
      },
    ]);
    expect(sent?.messages).toEqual([
      { role: "user", content: "list files" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_0", type: "function", function: { name: "sandbox__exec__v1", arguments: '{"cmd":"pwd"}' } }],
      },
      { role: "tool", tool_call_id: "call_0", content: "/workspace" },
    ]);
  });

  it("turns HTTP 500 into ModelProviderError with the status", async () => {
    const server = await serve(() => ({ kind: "error", status: 500, message: "upstream exploded" }));
    const error = await expectProviderError(complete(createOpenAiModelProvider({ env: {} }), spec(server)));
    expect(error.message).toContain("500");
    expect(server.requests).toHaveLength(1); // maxRetries: 0
  });

  it("turns a malformed body or a reply without choices into ModelProviderError", async () => {
    const provider = createOpenAiModelProvider({ env: {} });
    const garbled = await serve(() => ({ kind: "raw", body: "{not json" }));
    await expectProviderError(complete(provider, spec(garbled)));
    const empty = await serve(() => ({ kind: "raw", body: JSON.stringify({ id: "x", object: "chat.completion", choices: [] }) }));
    const error = await expectProviderError(complete(provider, spec(empty)));
    expect(error.message).toMatch(/no choices/);
  });

  it("times out after spec.timeoutMs with ModelProviderError", async () => {
    const server = await serve(() => ({ kind: "reply", text: "too late", delayMs: 3_000 }));
    const started = Date.now();
    const error = await expectProviderError(complete(createOpenAiModelProvider({ env: {} }), spec(server, { timeoutMs: 200 })));
    expect(error.message).toMatch(/timed out/);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("stops promptly when the signal aborts", async () => {
    const server = await serve(() => ({ kind: "reply", text: "too late", delayMs: 3_000 }));
    const controller = new AbortController();
    const started = Date.now();
    const pending = complete(createOpenAiModelProvider({ env: {} }), spec(server), undefined, undefined, controller.signal);
    setTimeout(() => controller.abort(), 100);
    const error = await expectProviderError(pending);
    expect(error.message).toMatch(/aborted/);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("decides through a json_schema response format with the choices as an enum", async () => {
    const server = await serve(() => ({ kind: "reply", text: JSON.stringify({ answer: "stop" }) }));
    const provider = createOpenAiModelProvider({ env: {} });

    const answer = await provider.decide({
      spec: spec(server),
      question: "The user said 'halt'. Continue or stop?",
      choices: ["continue", "stop"],
      signal: noSignal(),
    });

    expect(answer).toBe("stop");
    const sent = server.requests[0];
    expect(sent?.response_format).toEqual({
      type: "json_schema",
      json_schema: {
        name: "decision",
        strict: true,
        schema: {
          type: "object",
          properties: { answer: { type: "string", enum: ["continue", "stop"] } },
          required: ["answer"],
          additionalProperties: false,
        },
      },
    });
    expect(sent?.messages.at(0)?.role).toBe("system");
    expect(sent?.messages.at(-1)).toEqual({ role: "user", content: "The user said 'halt'. Continue or stop?" });
  });

  it("rejects decisions outside the enum or not in JSON", async () => {
    const provider = createOpenAiModelProvider({ env: {} });
    const decide = (server: OpenAiCompatibleServer): Promise<string> =>
      provider.decide({ spec: spec(server), question: "Continue?", choices: ["continue", "stop"], signal: noSignal() });

    const offEnum = await serve(() => ({ kind: "reply", text: JSON.stringify({ answer: "maybe" }) }));
    await expectProviderError(decide(offEnum));
    const notJson = await serve(() => ({ kind: "reply", text: "stop" }));
    await expectProviderError(decide(notJson));
  });

  it("names a missing API key variable without calling the server", async () => {
    const server = await serve(() => ({ kind: "reply", text: "unreachable" }));
    const provider = createOpenAiModelProvider({ env: { OTHER: "x" } });
    const error = await expectProviderError(complete(provider, spec(server, { apiKeyEnv: "KEEL_SECRET_TEST_MISSING_KEY" })));
    expect(error.message).toContain("KEEL_SECRET_TEST_MISSING_KEY");
    expect(server.requests).toHaveLength(0);
  });

  it("sends the key from apiKeyEnv as a bearer token, and never leaks it in errors", async () => {
    const key = "sk-test-secret-123";
    const server = await serve(() => ({ kind: "reply", text: "authorized" }), { apiKey: key });
    const good = createOpenAiModelProvider({ env: { KEEL_SECRET_TEST_KEY: key } });

    const turn = await complete(good, spec(server, { apiKeyEnv: "KEEL_SECRET_TEST_KEY" }));
    expect(turn.text).toBe("authorized");
    expect(server.headers[0]?.authorization).toBe(`Bearer ${key}`);

    const wrongKey = "sk-wrong-456";
    const bad = createOpenAiModelProvider({ env: { KEEL_SECRET_TEST_KEY: wrongKey } });
    const error = await expectProviderError(complete(bad, spec(server, { apiKeyEnv: "KEEL_SECRET_TEST_KEY" })));
    expect(error.message).toContain("401");
    expect(error.message).not.toContain(wrongKey);
    expect(server.headers[1]?.authorization).toBe(`Bearer ${wrongKey}`);
  });

  it("sends the placeholder key when apiKeyEnv is empty", async () => {
    const server = await serve(() => ({ kind: "reply", text: "ok" }));
    await complete(createOpenAiModelProvider({ env: {} }), spec(server));
    expect(server.headers[0]?.authorization).toBe("Bearer unused");
  });
});

describe("OpenAI-compatible test server", () => {
  it("streams SSE chunks the SDK assembles, with usage when asked", async () => {
    const server = await serve(() => ({
      kind: "reply",
      text: "streamed",
      toolCalls: [{ name: "sandbox__exec__v1", arguments: "{}" }],
      usage: { promptTokens: 5, completionTokens: 2 },
    }));
    const client = new OpenAI({ baseURL: server.url, apiKey: "unused", maxRetries: 0 });
    const stream = await client.chat.completions.create({
      model: "test-model",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finishReason: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined;
    const toolNames: string[] = [];
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      text += choice?.delta.content ?? "";
      for (const call of choice?.delta.tool_calls ?? []) if (call.function?.name) toolNames.push(call.function.name);
      finishReason = choice?.finish_reason ?? finishReason;
      usage = chunk.usage ?? usage;
    }
    expect({ text, toolNames, finishReason, usage }).toEqual({
      text: "streamed",
      toolNames: ["sandbox__exec__v1"],
      finishReason: "tool_calls",
      usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
    });
  });
});
