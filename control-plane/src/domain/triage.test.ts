import { describe, expect, it } from "vitest";
import { ZERO_USAGE } from "./run.js";
import { sideUsageOf, triageTimeoutMs, TRIAGE_TIMEOUT_MS, withSideUsage } from "./triage.js";

describe("triage helpers", () => {
  it("bounds the classifier by the shorter of its own timeout and the triage bound", () => {
    expect(triageTimeoutMs(0)).toBe(TRIAGE_TIMEOUT_MS);
    expect(triageTimeoutMs(300)).toBe(300);
    expect(triageTimeoutMs(60_000)).toBe(TRIAGE_TIMEOUT_MS);
  });

  it("reads stored side usage with missing or junk keys as zero", () => {
    expect(sideUsageOf({ inputTokens: 12, costMicroUsd: "x" })).toEqual({ modelCalls: 0, inputTokens: 12, outputTokens: 0, costMicroUsd: 0 });
    expect(sideUsageOf(undefined).modelCalls).toBe(0);
  });

  it("adds side calls to the loop's usage without touching what they do not use", () => {
    const loop = { ...ZERO_USAGE, iterations: 2, modelCalls: 2, inputTokens: 100, outputBytes: 9 };
    const total = withSideUsage(loop, { modelCalls: 1, inputTokens: 40, outputTokens: 3, costMicroUsd: 7 });
    expect(total).toEqual({ ...loop, modelCalls: 3, inputTokens: 140, outputTokens: 3, costMicroUsd: 7 });
  });
});
