import { describe, expect, it } from "vitest";
import type { ModelSpec } from "../domain/agent.js";
import { DEFAULT_TRIAGE } from "../domain/triage.js";
import type { ModelTurn } from "../domain/transcript.js";
import type { ModelProvider, ModelRequest } from "./model-provider.js";
import { parseTriage, triageRequest } from "./triage.js";

const spec = (timeoutMs: number): ModelSpec => ({
  provider: "scripted",
  model: "",
  endpoint: "",
  apiKeyEnv: "",
  prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
  scriptedTurns: [],
  timeoutMs,
});

const answering = (complete: (request: ModelRequest) => Promise<ModelTurn>): ModelProvider => ({ complete, decide: () => Promise.reject(new Error("unused")) });
const said = (text: string): Promise<ModelTurn> => Promise.resolve({ text, toolCalls: [], usage: { inputTokens: 7, outputTokens: 5 }, finishReason: "stop" });

describe("parseTriage", () => {
  it("reads the typed answer, tolerating prose or a fence around the object", () => {
    expect(parseTriage('```json\n{"duration":"long","shape":"graph_candidate","ack_text":"On it."}\n```')).toEqual({
      duration: "long",
      shape: "graph_candidate",
      ackText: "On it.",
    });
    expect(parseTriage('{"duration":"trivial","shape":"loop","ack_text":null}')).toEqual({ duration: "trivial", shape: "loop", ackText: undefined });
  });

  it("names what is wrong with an off-schema answer", () => {
    expect(parseTriage("it looks long")).toMatch(/no JSON object/);
    expect(parseTriage('{"duration":"forever","shape":"loop"}')).toMatch(/off-schema: duration/);
    expect(parseTriage(`{"duration":"long","shape":"loop","ack_text":"${"x".repeat(400)}"}`)).toMatch(/ack_text/);
  });
});

describe("triageRequest", () => {
  it("returns the model's triage with the call and its usage", async () => {
    const result = await triageRequest(answering(() => said('{"duration":"default","shape":"loop"}')), spec(0), "hi", new AbortController().signal);
    expect(result).toMatchObject({ triage: { duration: "default", shape: "loop" }, fellBack: undefined, call: { finishReason: "stop", usage: { inputTokens: 7 } } });
  });

  it("gives the defaults at its bound and aborts the call", async () => {
    let aborted = false;
    const slow = answering(
      (request) =>
        new Promise((_, reject) =>
          request.signal.addEventListener("abort", () => {
            aborted = true;
            reject(new Error("aborted"));
          }),
        ),
    );
    const result = await triageRequest(slow, spec(50), "hi", new AbortController().signal);
    expect(result).toMatchObject({ triage: DEFAULT_TRIAGE, fellBack: "no answer within 50 ms", call: { finishReason: "timeout" } });
    expect(aborted).toBe(true);
  });

  it("gives the defaults when the provider fails or answers off-schema", async () => {
    const failing = await triageRequest(answering(() => Promise.reject(new Error("HTTP 500"))), spec(0), "hi", new AbortController().signal);
    expect(failing).toMatchObject({ triage: DEFAULT_TRIAGE, fellBack: "HTTP 500", call: { finishReason: "error" } });
    const offSchema = await triageRequest(answering(() => said("sure")), spec(0), "hi", new AbortController().signal);
    expect(offSchema).toMatchObject({ triage: DEFAULT_TRIAGE, call: { finishReason: "off_schema", responseText: "sure" } });
  });
});
