// Issue #12, item 9: the runner redacts the run's secrets before every commit: the model's
// turn (text and tool-call arguments, so the call runs with what the ledger holds), tool results
// and failures, replies and questions.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import type { AgentSpec } from "../domain/agent.js";
import type { ModelTurn } from "../domain/transcript.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { toolGrants } from "../fixtures/scripted-model.js";
import type { ModelProvider } from "../models/model-provider.js";
import { askUserTool } from "../tools/ask-user-tool.js";
import { createToolRegistry, defineTool } from "../tools/tool-registry.js";
import { InMemoryRunStore } from "./in-memory-run-store.js";
import { advanceRun } from "./runner.js";

const SECRET = "s3cr3t-value-1234";
const ENV = { KEEL_SECRET_T: SECRET };
const turn = (text: string, calls: readonly [string, unknown][] = []): ModelTurn => ({
  text,
  toolCalls: calls.map(([name, args], i) => ({ id: `call_${i}`, name, argumentsJson: JSON.stringify(args) })),
  usage: { inputTokens: 1, outputTokens: 1 },
  finishReason: calls.length > 0 ? "tool_calls" : "stop",
});

async function run(turns: readonly ModelTurn[]) {
  const received: unknown[] = [];
  const echo = defineTool<{ text: string }>({
    name: "test.echo",
    version: 1,
    description: "echoes, and fails when asked to",
    parameters: z.object({ text: z.string() }),
    effect: "read",
    execute(args) {
      received.push(args.text);
      if (args.text.startsWith("fail")) return Promise.reject(new Error(`cannot: ${SECRET}`));
      return Promise.resolve({ ok: true, text: `echo ${args.text} and ${SECRET}`, artifacts: [{ type: "note", schemaVersion: "1", provenance: "observed", inlineData: SECRET }] });
    },
  });
  const agent: AgentSpec = {
    ...DEMO_AGENT,
    id: "redacting",
    tools: toolGrants(["test.echo.v1"]),
    sandbox: { ...DEMO_AGENT.sandbox, secrets: [{ envVar: "TOKEN", sourceEnv: "KEEL_SECRET_T" }] },
  };
  const store = new InMemoryRunStore(agent);
  const provider: ModelProvider = {
    complete: (request) => Promise.resolve(turns[Math.min(request.callIndex, turns.length - 1)]!),
    decide: () => Promise.reject(new Error("not used")),
  };
  const deps = {
    store,
    providers: { scripted: provider, openai: provider },
    tools: createToolRegistry([askUserTool, echo]),
    now: () => new Date(1_000),
    log: pino({ level: "silent" }),
    maxInvalidTurns: 3,
    readFlushMs: 0,
    secretEnv: ENV,
  };
  await advanceRun(deps, store.claim(), { workerId: "worker-1", signal: new AbortController().signal });
  return { store, received };
}

describe("runner redaction (issue #12, item 9)", () => {
  it("redacts turns, arguments, results, failures and the reply before they are committed", async () => {
    const { store, received } = await run([
      turn(`thinking about ${SECRET}`, [
        ["test.echo.v1", { text: `arg ${SECRET}` }],
        ["test.echo.v1", { text: `fail ${SECRET}` }],
      ]),
      turn(`the answer is ${SECRET}`),
    ]);
    expect(received).toEqual(["arg [redacted:TOKEN]", "fail [redacted:TOKEN]"]);
    const everything = JSON.stringify({ steps: store.steps, emissions: store.emissions, commits: store.commits, reply: store.finalReply });
    expect(everything).not.toContain(SECRET);
    expect(store.finalReply).toBe("the answer is [redacted:TOKEN]");
    const [ok, failed] = store.steps[0]!.invocations;
    expect(ok?.resultText).toBe("echo arg [redacted:TOKEN] and [redacted:TOKEN]");
    expect(failed?.resultText).toContain("cannot: [redacted:TOKEN]");
  });

  it("redacts a question the model asks", async () => {
    const { store } = await run([turn("", [["keel.ask_user.v1", { question: `is ${SECRET} right?` }]])]);
    expect(store.status).toBe("awaiting_input");
    expect(store.emissions.map((e) => e.text)).toEqual(["is [redacted:TOKEN] right?"]);
  });
});
