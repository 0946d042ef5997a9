import { describe, expect, it } from "vitest";
import { keptNodes, revisionResult, type FinishedNode } from "./work-graph-revision.js";

const finished = (key: string, dependsOn: string[] = [], kind = "agent_loop"): FinishedNode => ({ key, kind, objective: `Do ${key}`, dependsOn, output: `${key} out` });
const proposed = (key: string, dependsOn: string[] = [], kind = "agent_loop", objective = `Do ${key}`) => ({ key, kind, objective, dependsOn });

describe("the nodes a revision keeps", () => {
  it("keeps a node proposed again unchanged, with its result, and those fed only by kept nodes", () => {
    const before = [finished("a"), finished("b", ["a"]), finished("j", ["a", "b"], "join")];
    const kept = keptNodes(before, [proposed("a"), proposed("b", ["a"]), proposed("j", ["a", "b"], "join"), proposed("new", ["j"])]);
    expect([...kept]).toEqual([
      ["a", "a out"],
      ["b", "b out"],
      ["j", "j out"],
    ]);
  });

  it("runs again a node whose objective or kind changed, and everything it feeds", () => {
    const before = [finished("a"), finished("b", ["a"])];
    expect([...keptNodes(before, [proposed("a", [], "agent_loop", "Do a, in Rust"), proposed("b", ["a"])]).keys()]).toEqual([]);
    expect([...keptNodes(before, [proposed("a", [], "verify"), proposed("b", ["a"])]).keys()]).toEqual([]);
  });

  it("runs again a node with a new input, and never keeps a gate", () => {
    const before = [finished("a"), finished("b", ["a"]), finished("ok", ["b"], "human_gate")];
    expect([...keptNodes(before, [proposed("a"), proposed("x"), proposed("b", ["a", "x"])]).keys()]).toEqual(["a"]);
    expect([...keptNodes(before, [proposed("a"), proposed("b", ["a"]), proposed("ok", ["b"], "human_gate")]).keys()]).toEqual(["a", "b"]);
  });
});

describe("the proposing call's result when a refinement stops the graph", () => {
  it("hands over what finished, names what did not run, and says how to go on", () => {
    const text = revisionResult(
      [
        { key: "draft", status: "succeeded", output: "the draft" },
        { key: "sign-off", status: "blocked", output: undefined },
        { key: "ship", status: "pending", output: undefined },
      ],
      { used: 0, limit: 3 },
    );
    expect(text).toContain("1 of 3 nodes had finished");
    expect(text).toContain("--- draft ---\nthe draft");
    expect(text).toContain('Not run: "sign-off", "ship".');
    expect(text).toContain("revision 1 of 3");
    expect(text).toContain("keeps its result and does not run again");
  });
});
