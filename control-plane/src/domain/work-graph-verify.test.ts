import { describe, expect, it } from "vitest";
import { childInput, graphResult, verifierVerdict } from "./work-graph-child.js";

describe("verifierVerdict", () => {
  it("passes only a reply that starts with PASS, in any case or punctuation", () => {
    expect(verifierVerdict("PASS: units given")).toEqual({ passed: true, output: "PASS: units given" });
    expect(verifierVerdict("  pass.\nall good")).toMatchObject({ passed: true });
    expect(verifierVerdict("FAIL - no units")).toEqual({ passed: false, output: "FAIL - no units" });
  });

  it("fails a reply that is neither, saying so", () => {
    expect(verifierVerdict("Looks fine to me")).toEqual({ passed: false, output: "the verifier answered neither PASS nor FAIL: Looks fine to me" });
    expect(verifierVerdict("PASSED")).toMatchObject({ passed: false });
  });
});

describe("a verify node's input", () => {
  it("hands over the subject's output with how to answer, apart from its other inputs", () => {
    const input = childInput({ key: "check", objective: "Units are given" }, [
      { key: "answer", output: "42" },
      { key: "notes", output: "n" },
    ], { key: "answer", output: "42" });
    expect(input).toContain('You are checking the output of node "answer" against the objective. Start your reply with PASS or FAIL on its own line');
    expect(input).toContain("--- answer ---\n42");
    expect(input).toContain("What the nodes before this one produced:\n--- notes ---\nn");
    expect(input.match(/--- answer ---/g)).toHaveLength(1);
  });
});

describe("a failed graph's result", () => {
  const nodes = [{ key: "check", status: "failed", output: "FAIL: no units" }];
  it("offers a replan while the ceiling allows one", () => {
    expect(graphResult("failed", nodes, ["check"], { used: 0, limit: 2 })).toContain("You may propose a revised graph (replan 1 of 2)");
  });
  it("asks for an answer once the ceiling is reached", () => {
    const text = graphResult("failed", nodes, ["check"], { used: 2, limit: 2 });
    expect(text).not.toContain("You may propose");
    expect(text).toContain("Now answer the request from these results.");
  });
});
