import { describe, expect, it } from "vitest";
import type { ModelSpec } from "../domain/agent.js";
import { decide } from "./decision.js";
import type { ModelProvider } from "./model-provider.js";

const spec: ModelSpec = {
  provider: "scripted",
  model: "",
  endpoint: "",
  apiKeyEnv: "",
  prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
  scriptedTurns: [],
  timeoutMs: 1000,
};
const question = { question: "Is this a yes?", choices: ["yes", "no", "unclear"] as const, fallback: "unclear" as const, timeoutMs: 50 };

function providerAnswering(answer: () => Promise<string>): ModelProvider {
  return { complete: () => Promise.reject(new Error("unused")), decide: answer };
}

describe("decide", () => {
  it("returns the model's choice when it is one of the choices", async () => {
    const decision = await decide(providerAnswering(() => Promise.resolve("yes")), spec, question, new AbortController().signal);
    expect(decision).toMatchObject({ choice: "yes", fellBack: undefined, call: { responseText: "yes", finishReason: "stop" } });
  });

  it("falls back when the answer is off the list", async () => {
    const decision = await decide(providerAnswering(() => Promise.resolve("maybe")), spec, question, new AbortController().signal);
    expect(decision.choice).toBe("unclear");
    expect(decision.fellBack).toContain("maybe");
  });

  it("falls back when the model fails", async () => {
    const decision = await decide(providerAnswering(async () => Promise.reject(new Error("HTTP 500"))), spec, question, new AbortController().signal);
    expect(decision).toMatchObject({ choice: "unclear", fellBack: "HTTP 500", call: { finishReason: "error" } });
  });

  it("falls back when the model is slower than the question allows, even if it ignores the signal", async () => {
    const slow = providerAnswering(() => new Promise((resolve) => setTimeout(() => resolve("yes"), 500)));
    const started = Date.now();
    const decision = await decide(slow, spec, question, new AbortController().signal);
    expect(decision.choice).toBe("unclear");
    expect(decision.fellBack).toContain("50 ms");
    expect(Date.now() - started).toBeLessThan(400);
  });
});
