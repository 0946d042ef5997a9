import { describe, expect, it } from "vitest";
import { describeMerge, mergeWorkspaces, type InputWorkspace } from "./workspace-merge.js";

const file = (path: string, sha256: string, sizeBytes = 3) => ({ path, sha256, sizeBytes });
const input = (key: string, files: InputWorkspace["files"], skipped: string[] = []): InputWorkspace => ({ key, files, skipped });

describe("mergeWorkspaces", () => {
  it("applies every input's files, each from the input that left it", () => {
    const merge = mergeWorkspaces([input("a", [file("/workspace/a.txt", "1")]), input("b", [file("/workspace/b.txt", "2")])]);
    expect(merge).toEqual({
      apply: [
        { path: "/workspace/a.txt", from: "a", sizeBytes: 3 },
        { path: "/workspace/b.txt", from: "b", sizeBytes: 3 },
      ],
      conflicts: [],
    });
  });

  it("keeps the earlier input's version of a path left different by later ones, and reports each", () => {
    const merge = mergeWorkspaces([
      input("a", [file("/workspace/shared.txt", "x")]),
      input("b", [file("/workspace/shared.txt", "y")]),
      input("c", [file("/workspace/shared.txt", "z")]),
    ]);
    expect(merge.apply).toEqual([{ path: "/workspace/shared.txt", from: "a", sizeBytes: 3 }]);
    expect(merge.conflicts).toEqual([{ path: "/workspace/shared.txt", kept: "a", dropped: ["b", "c"] }]);
  });

  it("the same content left by two inputs is no conflict", () => {
    const merge = mergeWorkspaces([input("a", [file("/workspace/same.txt", "s")]), input("b", [file("/workspace/same.txt", "s")])]);
    expect(merge.conflicts).toEqual([]);
    expect(merge.apply).toHaveLength(1);
  });

  it("depends on input order, not on the order files were listed", () => {
    const ab = mergeWorkspaces([input("a", [file("/p", "1")]), input("b", [file("/p", "2")])]);
    const ba = mergeWorkspaces([input("b", [file("/p", "2")]), input("a", [file("/p", "1")])]);
    expect(ab.conflicts).toEqual([{ path: "/p", kept: "a", dropped: ["b"] }]);
    expect(ba.conflicts).toEqual([{ path: "/p", kept: "b", dropped: ["a"] }]);
  });
});

describe("describeMerge", () => {
  it("says what was applied from whom, what conflicted and what was not carried", () => {
    const inputs = [input("a", [file("/workspace/a.txt", "1"), file("/workspace/shared.txt", "x")], ["/workspace/link"]), input("b", [file("/workspace/shared.txt", "y")])];
    const text = describeMerge(inputs, mergeWorkspaces(inputs));
    expect(text).toContain(`Reconciled the workspaces of "a", "b" into the root run's workspace: 2 file(s) applied, 1 conflict(s).`);
    expect(text).toContain(`From "a":\n  /workspace/a.txt (3 bytes)\n  /workspace/shared.txt (3 bytes)`);
    expect(text).toContain(`/workspace/shared.txt: "a" kept; "b" left a different version`);
    expect(text).toContain(`Not carried (links and special files):\n  /workspace/link (in "a")`);
  });

  it("stays bounded however many files there are", () => {
    const many = input("a", Array.from({ length: 5_000 }, (_, i) => file(`/workspace/f${i}`, String(i))));
    const text = describeMerge([many], mergeWorkspaces([many]));
    expect(text).toContain("… and 4950 more");
    expect(text.split("\n").length).toBeLessThan(60);
  });
});
