import { describe, expect, it } from "vitest";
import type { ModelSpec, ScriptedTurn } from "../domain/agent.js";
import { ModelProviderError } from "../domain/errors.js";
import type { ModelMessage } from "../domain/transcript.js";
import type { ModelRequest } from "./model-provider.js";
import { createScriptedModelProvider } from "./scripted-model-provider.js";

function turn(overrides: Partial<ScriptedTurn> = {}): ScriptedTurn {
  return { replyText: "", toolCalls: [], delayMs: 0, inputTokens: 0, outputTokens: 0, ...overrides };
}

function spec(scriptedTurns: readonly ScriptedTurn[]): ModelSpec {
  return {
    provider: "scripted",
    model: "scripted",
    endpoint: "",
    apiKeyEnv: "",
    prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
    scriptedTurns,
    timeoutMs: 0,
  };
}

function request(
  scriptedTurns: readonly ScriptedTurn[],
  callIndex: number,
  messages: readonly ModelMessage[] = [{ role: "user", content: "hi" }],
  signal: AbortSignal = new AbortController().signal,
): ModelRequest {
  return { spec: spec(scriptedTurns), messages, tools: [], callIndex, signal };
}

describe("scripted model provider: complete", () => {
  const provider = createScriptedModelProvider();

  it("plays turns in call order and repeats the last one past the end", async () => {
    const turns = [turn({ replyText: "first" }), turn({ replyText: "second" })];
    const texts = [];
    for (const callIndex of [0, 1, 2, 5]) texts.push((await provider.complete(request(turns, callIndex))).text);
    expect(texts).toEqual(["first", "second", "second", "second"]);
  });

  it("echoes the latest user message when nothing is scripted", async () => {
    const messages: ModelMessage[] = [
      { role: "system", content: "be brief" },
      { role: "user", content: "older" },
      { role: "assistant", content: "ok", toolCalls: [] },
      { role: "user", content: "newest" },
      { role: "tool", toolCallId: "x", content: "tool output" },
    ];
    const reply = await provider.complete(request([], 0, messages));
    expect(reply.text).toBe("Echo: newest");
    expect(reply.finishReason).toBe("stop");
    expect(reply.toolCalls).toEqual([]);
  });

  it("replaces every {{message}} placeholder, with an empty string when no user spoke", async () => {
    const turns = [turn({ replyText: "[{{message}}|{{message}}]" })];
    expect((await provider.complete(request(turns, 0, [{ role: "user", content: "x y" }]))).text).toBe("[x y|x y]");
    expect((await provider.complete(request(turns, 0, [{ role: "system", content: "s" }]))).text).toBe("[|]");
  });

  it("maps tool calls with ids derived from the call index", async () => {
    const turns = [
      turn({
        replyText: "calling",
        toolCalls: [
          { toolName: "sandbox.exec.v1", argumentsJson: '{"cmd":"ls"}' },
          { toolName: "keel.ask_user.v1", argumentsJson: "{}" },
        ],
      }),
    ];
    const reply = await provider.complete(request(turns, 3));
    expect(reply.toolCalls).toEqual([
      { id: "call_3_0", name: "sandbox.exec.v1", argumentsJson: '{"cmd":"ls"}' },
      { id: "call_3_1", name: "keel.ask_user.v1", argumentsJson: "{}" },
    ]);
    expect(reply.finishReason).toBe("tool_calls");
  });

  it("reports scripted token usage when given", async () => {
    const reply = await provider.complete(request([turn({ replyText: "x", inputTokens: 120, outputTokens: 7 })], 0));
    expect(reply.usage).toEqual({ inputTokens: 120, outputTokens: 7 });
  });

  it("estimates usage at ceil(chars / 4) when the script leaves it zero", async () => {
    const messages: ModelMessage[] = [
      { role: "system", content: "12345" }, // 5
      { role: "user", content: "abcd" }, // 4
    ];
    const reply = await provider.complete(request([turn({ replyText: "hello" })], 0, messages));
    expect(reply.usage).toEqual({ inputTokens: Math.ceil(9 / 4), outputTokens: Math.ceil(5 / 4) });
  });

  it("waits out delayMs", async () => {
    const started = Date.now();
    await provider.complete(request([turn({ replyText: "late", delayMs: 60 })], 0));
    expect(Date.now() - started).toBeGreaterThanOrEqual(50);
  });

  it("rejects promptly with ModelProviderError when the signal aborts during a delay", async () => {
    const controller = new AbortController();
    const started = Date.now();
    const pending = provider.complete(request([turn({ delayMs: 10_000 })], 0, undefined, controller.signal));
    setTimeout(() => controller.abort(new Error("cancelled by test")), 20);
    await expect(pending).rejects.toBeInstanceOf(ModelProviderError);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it("rejects at once when the signal is already aborted", async () => {
    const controller = new AbortController();
    controller.abort();
    await expect(provider.complete(request([turn()], 0, undefined, controller.signal))).rejects.toBeInstanceOf(
      ModelProviderError,
    );
  });
});

describe("scripted model provider: decide", () => {
  const provider = createScriptedModelProvider();
  const decide = (turns: readonly ScriptedTurn[], choices: readonly string[]): Promise<string> =>
    provider.decide({ spec: spec(turns), question: "Continue or stop?", choices, signal: new AbortController().signal });

  it("answers turn 0's trimmed reply when it is one of the choices", async () => {
    await expect(decide([turn({ replyText: "  stop\n" }), turn({ replyText: "continue" })], ["continue", "stop"])).resolves.toBe(
      "stop",
    );
  });

  it("matches case-insensitively and returns the choice as spelled by the caller", async () => {
    await expect(decide([turn({ replyText: "STOP" })], ["continue", "stop"])).resolves.toBe("stop");
  });

  it("throws ModelProviderError when the reply is not a choice or nothing is scripted", async () => {
    await expect(decide([turn({ replyText: "maybe" })], ["continue", "stop"])).rejects.toThrow(
      new ModelProviderError("scripted decision model has no answer"),
    );
    await expect(decide([], ["continue", "stop"])).rejects.toBeInstanceOf(ModelProviderError);
  });
});
