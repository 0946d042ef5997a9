// The durable loop driven by the openai provider over real HTTP: the real SDK talks to a local
// OpenAI-compatible server that answers with tool calls twice (two calls at once the second
// time) and then with a final text.
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ModelSpec } from "../control-plane/src/domain/agent.js";
import { connectClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { startOpenAiCompatibleServer, type CompletionScript, type OpenAiCompatibleServer } from "./support/openai-compatible-server.js";
import { createTestTools } from "./support/test-tools.js";

const USAGE = [
  { promptTokens: 120, completionTokens: 11 },
  { promptTokens: 180, completionTokens: 23 },
  { promptTokens: 260, completionTokens: 7 },
];

/** Tool calls on requests 0 and 1 (two at once on 1), then the final answer. */
const script: CompletionScript = (_request, index) => {
  const usage = USAGE[index] ?? { promptTokens: 1, completionTokens: 1 };
  switch (index) {
    case 0:
      return { kind: "reply", text: null, toolCalls: [{ id: "call_a", name: "test__echo__v1", arguments: '{"text":"one"}' }], usage };
    case 1:
      return {
        kind: "reply",
        text: "Two more lookups.",
        toolCalls: [
          { id: "call_b", name: "test__echo__v1", arguments: '{"text":"two"}' },
          { id: "call_c", name: "test__echo__v1", arguments: '{"text":"three"}' },
        ],
        usage,
      };
    default:
      return { kind: "reply", text: "The echoes were one, two and three.", usage };
  }
};

describe("the openai provider driving the loop", () => {
  let server: OpenAiCompatibleServer;
  let keel: TestKeel;

  beforeAll(async () => {
    server = await startOpenAiCompatibleServer(script);
    const model: ModelSpec = {
      provider: "openai",
      model: "test-model",
      endpoint: server.url,
      apiKeyEnv: "",
      prices: { inputMicroUsdPerMtok: 2_000_000, outputMicroUsdPerMtok: 10_000_000 },
      scriptedTurns: [],
      timeoutMs: 10_000,
    };
    const agent: AgentSpec = {
      ...DEMO_AGENT,
      id: "openai-echo",
      systemPrompt: "You echo things.",
      models: { primary: model, fast: model, decision: model },
      tools: [{ toolName: "test.echo.v1", connectors: [], readOnlyCommands: [] }],
    };
    keel = await startTestKeel({ tools: createTestTools({ effectsDir: await mkdtemp(path.join(tmpdir(), "keel-openai-loop-")) }), agents: [agent] });
  });

  afterAll(async () => {
    await keel?.stop();
    await server?.close();
  });

  it("runs several tool calls to a final text and records what the server said it used", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { runId } = await ingress.submitMessage({
      agentId: "openai-echo",
      conversationId: "openai-c",
      actor: { id: "alice" },
      messageId: "openai-m-1",
      text: "echo one, two and three",
      connector: "openai-test",
    });
    let run: Run | undefined;
    for (let i = 0; i < 400; i++) {
      run = (await runs.getRun({ runId })).run;
      if (run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.BUDGET_EXHAUSTED, RunStatus.CANCELLED].includes(run.status)) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    expect(run?.status, run?.error).toBe(RunStatus.SUCCEEDED);
    expect(run?.finalReply).toBe("The echoes were one, two and three.");

    // Three requests, each carrying the tool catalog with JSON Schema parameters.
    expect(server.requests).toHaveLength(3);
    for (const request of server.requests) {
      expect(request.model).toBe("test-model");
      const echo = (request.tools ?? []).find((t: ChatCompletionTool) => t.type === "function" && t.function.name === "test__echo__v1");
      expect(echo).toMatchObject({
        type: "function",
        function: {
          description: "Returns its text (a read).",
          parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"], additionalProperties: false },
        },
      });
    }
    const [system, user] = server.requests[0]?.messages ?? [];
    expect(system?.role).toBe("system");
    expect(system?.content).toEqual(expect.stringContaining("You echo things."));
    expect(user).toMatchObject({ role: "user", content: "echo one, two and three" });

    // Every tool call goes back as the assistant's tool_calls and one tool message with its id.
    const second = server.requests[1]!.messages;
    expect(second.slice(2)).toEqual([
      { role: "assistant", content: null, tool_calls: [{ id: "call_a", type: "function", function: { name: "test__echo__v1", arguments: '{"text":"one"}' } }] },
      { role: "tool", tool_call_id: "call_a", content: "echo: one" },
    ]);
    const third = server.requests[2]!.messages;
    expect(third.slice(4)).toEqual([
      {
        role: "assistant",
        content: "Two more lookups.",
        tool_calls: [
          { id: "call_b", type: "function", function: { name: "test__echo__v1", arguments: '{"text":"two"}' } },
          { id: "call_c", type: "function", function: { name: "test__echo__v1", arguments: '{"text":"three"}' } },
        ],
      },
      { role: "tool", tool_call_id: "call_b", content: "echo: two" },
      { role: "tool", tool_call_id: "call_c", content: "echo: three" },
    ] satisfies ChatCompletionMessageParam[]);

    // The server's token counts are the run's, call by call and in total, and priced.
    const inputTokens = USAGE.reduce((sum, u) => sum + u.promptTokens, 0);
    const outputTokens = USAGE.reduce((sum, u) => sum + u.completionTokens, 0);
    expect(run?.usage).toMatchObject({ iterations: 3, modelCalls: 3, toolCalls: 3, inputTokens: BigInt(inputTokens), outputTokens: BigInt(outputTokens) });
    const perCall = USAGE.map((u) => Math.ceil((u.promptTokens * 2_000_000 + u.completionTokens * 10_000_000) / 1_000_000));
    expect(run?.usage?.costMicroUsd).toBe(BigInt(perCall.reduce((a, b) => a + b, 0)));

    const { steps } = await runs.listRunSteps({ runId });
    expect(steps.map((s) => [s.modelCall?.provider, s.modelCall?.model, s.modelCall?.usage?.inputTokens, s.modelCall?.usage?.outputTokens, s.modelCall?.finishReason])).toEqual(
      USAGE.map((u, i) => ["openai", "test-model", BigInt(u.promptTokens), BigInt(u.completionTokens), i < 2 ? "tool_calls" : "stop"]),
    );
    expect(steps.map((s) => s.toolInvocations.map((t) => [t.toolName, t.argumentsJson, t.status, t.resultText]))).toEqual([
      [["test.echo.v1", '{"text":"one"}', ToolInvocationStatus.SUCCEEDED, "echo: one"]],
      [
        ["test.echo.v1", '{"text":"two"}', ToolInvocationStatus.SUCCEEDED, "echo: two"],
        ["test.echo.v1", '{"text":"three"}', ToolInvocationStatus.SUCCEEDED, "echo: three"],
      ],
      [],
    ]);
  });
});
