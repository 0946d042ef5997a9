import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { PathRule, Policy, ToolEffect } from "./agent.js";
import { mayAdvertise, mayDispatch, normalizePosixPath, unversionedToolName, type ToolFacts } from "./policy.js";

const allowAll: Policy = { kind: "allow_all", networkAccess: false };

function restriction(
  options: { tools?: readonly string[]; effects?: readonly ToolEffect[]; pathRules?: readonly PathRule[] } = {},
): Policy {
  return {
    kind: "restriction",
    allowedTools: options.tools ?? [],
    allowedEffects: options.effects ?? [],
    pathRules: options.pathRules ?? [],
    networkAccess: false,
  };
}

const readFile: ToolFacts = { fullName: "fs.read.v1", effect: "read" };
const writeFile: ToolFacts = { fullName: "fs.write.v2", effect: "write" };

function reasonOf(decision: ReturnType<typeof mayDispatch>): string {
  if (decision.allowed) throw new Error("expected a refusal");
  return decision.reason;
}

describe("normalizePosixPath", () => {
  it.each([
    ["/workspace/a/b", "/workspace/a/b"],
    ["/workspace//a///b/", "/workspace/a/b"],
    ["/workspace/./a/./b", "/workspace/a/b"],
    ["/workspace/allowed/../secret", "/workspace/secret"],
    ["/../../etc/passwd", "/etc/passwd"],
    ["/", "/"],
    ["//", "/"],
    ["a/b", "/workspace/a/b"],
    ["./a", "/workspace/a"],
    ["../etc", "/etc"],
    ["", "/workspace"],
    [".", "/workspace"],
    ["/a/b/../../..", "/"],
  ])("%j → %j", (input, expected) => {
    expect(normalizePosixPath(input)).toBe(expected);
  });

  it("is idempotent, absolute, and free of dot segments and doubled slashes", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("a", "b", ".", "..", "", "/", "c d"), { maxLength: 12 }), (parts) => {
        const once = normalizePosixPath(parts.join("/"));
        expect(normalizePosixPath(once)).toBe(once);
        expect(once.startsWith("/")).toBe(true);
        expect(once).not.toMatch(/\/\/|(^|\/)\.\.?(\/|$)/);
        if (once !== "/") expect(once.endsWith("/")).toBe(false);
      }),
    );
  });
});

describe("unversionedToolName", () => {
  it("drops only a trailing vN segment", () => {
    expect(unversionedToolName("fs.read.v1")).toBe("fs.read");
    expect(unversionedToolName("fs.read.v12")).toBe("fs.read");
    expect(unversionedToolName("fs.read")).toBe("fs.read");
    expect(unversionedToolName("fs.version")).toBe("fs.version");
  });
});

describe("allow_all", () => {
  it("allows every tool and every argument", () => {
    expect(mayAdvertise(allowAll, writeFile)).toEqual({ allowed: true });
    expect(mayDispatch(allowAll, writeFile, { path: "/etc/passwd", mode: 7 })).toEqual({ allowed: true });
  });
});

describe("restriction: tools and effects", () => {
  it("treats empty tool and effect lists as no restriction", () => {
    expect(mayAdvertise(restriction(), writeFile)).toEqual({ allowed: true });
  });

  it("matches the full name or the unversioned name", () => {
    expect(mayAdvertise(restriction({ tools: ["fs.read.v1"] }), readFile).allowed).toBe(true);
    expect(mayAdvertise(restriction({ tools: ["fs.read"] }), readFile).allowed).toBe(true);
    expect(mayAdvertise(restriction({ tools: ["fs.read.v2"] }), readFile).allowed).toBe(false);
    expect(mayAdvertise(restriction({ tools: ["fs"] }), readFile).allowed).toBe(false);
  });

  it("names the tool when refusing it", () => {
    const decision = mayAdvertise(restriction({ tools: ["fs.read"] }), writeFile);
    expect(reasonOf(decision)).toBe('tool "fs.write.v2" is not among the allowed tools (fs.read)');
  });

  it("refuses effects not listed", () => {
    const policy = restriction({ effects: ["read"] });
    expect(mayAdvertise(policy, readFile).allowed).toBe(true);
    expect(reasonOf(mayAdvertise(policy, writeFile))).toBe(
      'tool "fs.write.v2" has the write effect, and only read tools are allowed',
    );
  });

  it("re-checks tools and effects at dispatch", () => {
    const policy = restriction({ tools: ["fs.read"], effects: ["read"] });
    expect(mayDispatch(policy, writeFile, {}).allowed).toBe(false);
    expect(mayDispatch(policy, readFile, {}).allowed).toBe(true);
  });
});

describe("restriction: path rules", () => {
  const allowedRule: PathRule = { field: "path", prefixes: ["/workspace/allowed"] };
  const policy = restriction({ pathRules: [allowedRule] });

  it.each([
    ["/workspace/allowed", true],
    ["/workspace/allowed/", true],
    ["/workspace/allowed/x/y.txt", true],
    ["/workspace//allowed/./x", true],
    ["allowed/x", true],
    ["/workspace/allowed/x/../y", true],
    ["/workspace/allowed/../secret", false],
    ["/workspace/allowedx", false],
    ["/workspace", false],
    ["/etc/passwd", false],
    ["../workspace/allowed/../../etc", false],
  ])("path %j allowed=%s", (path, allowed) => {
    expect(mayDispatch(policy, readFile, { path }).allowed).toBe(allowed);
  });

  it("does not treat a sibling with a shared prefix as inside", () => {
    const narrow = restriction({ pathRules: [{ field: "path", prefixes: ["/workspace/ab"] }] });
    expect(mayDispatch(narrow, readFile, { path: "/workspace/a" }).allowed).toBe(false);
    expect(mayDispatch(narrow, readFile, { path: "/workspace/abc" }).allowed).toBe(false);
    expect(mayDispatch(narrow, readFile, { path: "/workspace/ab/c" }).allowed).toBe(true);
  });

  it("explains the refusal with field, value and prefixes", () => {
    expect(reasonOf(mayDispatch(policy, readFile, { path: "/etc/passwd" }))).toBe(
      'path field "path" value "/etc/passwd" is outside the allowed prefixes /workspace/allowed',
    );
    expect(reasonOf(mayDispatch(policy, readFile, { path: "/workspace/allowed/../secret" }))).toBe(
      'path field "path" value "/workspace/allowed/../secret" (which resolves to "/workspace/secret") is outside the allowed prefixes /workspace/allowed',
    );
  });

  it("normalizes the configured prefixes too", () => {
    const messy = restriction({ pathRules: [{ field: "path", prefixes: ["src/", "/tmp//x/."] }] });
    expect(mayDispatch(messy, readFile, { path: "/workspace/src/a.ts" }).allowed).toBe(true);
    expect(mayDispatch(messy, readFile, { path: "/tmp/x/y" }).allowed).toBe(true);
    expect(reasonOf(mayDispatch(messy, readFile, { path: "/tmp/y" }))).toContain("/workspace/src, /tmp/x");
  });

  it("a root prefix admits every absolute path", () => {
    const root = restriction({ pathRules: [{ field: "path", prefixes: ["/"] }] });
    expect(mayDispatch(root, readFile, { path: "/etc/passwd" }).allowed).toBe(true);
  });

  it("a rule with no prefixes admits no path", () => {
    const none = restriction({ pathRules: [{ field: "path", prefixes: [] }] });
    expect(reasonOf(mayDispatch(none, readFile, { path: "/workspace" }))).toContain("no path is allowed");
  });

  it("checks every element of an array field", () => {
    expect(mayDispatch(policy, readFile, { path: ["/workspace/allowed/a", "/workspace/allowed/b"] }).allowed).toBe(true);
    expect(reasonOf(mayDispatch(policy, readFile, { path: ["/workspace/allowed/a", "/root/.ssh"] }))).toContain(
      '"/root/.ssh"',
    );
    expect(mayDispatch(policy, readFile, { path: [] }).allowed).toBe(true);
  });

  it.each([[42], [null], [{ nested: "/workspace/allowed" }], [["/workspace/allowed", 3]], [true]])(
    "refuses a non-string value %j",
    (value) => {
      const reason = reasonOf(mayDispatch(policy, readFile, { path: value }));
      expect(reason).toContain('path field "path"');
      expect(reason).toContain("fs.read.v1");
    },
  );

  it("refuses NUL characters", () => {
    expect(mayDispatch(policy, readFile, { path: "/workspace/allowed/a\0b" }).allowed).toBe(false);
  });

  it("skips rules whose field is absent, including inherited property names", () => {
    const odd = restriction({ pathRules: [{ field: "constructor", prefixes: ["/workspace"] }, allowedRule] });
    expect(mayDispatch(odd, readFile, { other: "/etc/passwd" }).allowed).toBe(true);
    expect(mayDispatch(odd, readFile, { path: "/workspace/allowed/a" }).allowed).toBe(true);
  });

  it("applies every rule whose field is present", () => {
    const two = restriction({
      pathRules: [
        { field: "src", prefixes: ["/workspace/in"] },
        { field: "dest", prefixes: ["/workspace/out"] },
      ],
    });
    expect(mayDispatch(two, writeFile, { src: "/workspace/in/a", dest: "/workspace/out/a" }).allowed).toBe(true);
    expect(reasonOf(mayDispatch(two, writeFile, { src: "/workspace/in/a", dest: "/workspace/in/a" }))).toContain(
      'path field "dest"',
    );
  });

  it("does not apply path rules at advertisement", () => {
    expect(mayAdvertise(policy, readFile).allowed).toBe(true);
  });

  it("never allows a path that escapes the prefix after normalization", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("allowed", "x", "..", ".", "", "secret"), { maxLength: 10 }), (parts) => {
        const raw = `/workspace/${parts.join("/")}`;
        const decision = mayDispatch(policy, readFile, { path: raw });
        const resolved = normalizePosixPath(raw);
        const inside = resolved === "/workspace/allowed" || resolved.startsWith("/workspace/allowed/");
        expect(decision.allowed).toBe(inside);
      }),
    );
  });
});
