import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createStreamRedactor, execEffect, redactOutputTail, redactSecrets, resolveWorkspacePath, storableText } from "./sandbox.js";

const grant = (readOnlyCommands: string[]) => ({ toolName: "sandbox.exec.v1", connectors: [], readOnlyCommands });

describe("resolveWorkspacePath", () => {
  it("keeps paths inside /workspace and resolves relative ones against it", () => {
    expect(resolveWorkspacePath("notes.txt")).toEqual({ ok: true, path: "/workspace/notes.txt" });
    expect(resolveWorkspacePath("/workspace/a/../b/./c")).toEqual({ ok: true, path: "/workspace/b/c" });
    expect(resolveWorkspacePath("/workspace")).toEqual({ ok: true, path: "/workspace" });
    expect(resolveWorkspacePath(".")).toEqual({ ok: true, path: "/workspace" });
  });

  it("refuses traversal, other roots and look-alike prefixes", () => {
    for (const bad of ["../etc/passwd", "/etc/passwd", "/workspace/../etc", "/workspace-other/x", "a/../../x", "", "a\0b"]) {
      expect(resolveWorkspacePath(bad).ok, bad).toBe(false);
    }
  });
});

describe("execEffect", () => {
  it("is a read only for a declared program used on its own", () => {
    expect(execEffect("sleep 5", grant(["sleep", "ls"]))).toBe("read");
    expect(execEffect("  ls -la /workspace", grant(["sleep", "ls"]))).toBe("read");
    expect(execEffect("rm -rf /workspace", grant(["sleep", "ls"]))).toBe("write");
    expect(execEffect("sleep 5", undefined)).toBe("write");
  });

  it("never counts chained, redirected or substituted commands as reads", () => {
    for (const command of ["ls; rm x", "ls && rm x", "ls | tee x", "ls > x", "ls `rm x`", "ls $(rm x)", "ls\nrm x", "ls & rm x"]) {
      expect(execEffect(command, grant(["ls"])), command).toBe("write");
    }
  });
});

describe("secret redaction", () => {
  const secrets = [{ name: "TOKEN", value: "s3cr3t-value" }, { name: "SHORT", value: "s3cr3t" }];

  it("replaces whole values, the longest first", () => {
    expect(redactSecrets("a s3cr3t-value b s3cr3t c", secrets)).toBe("a [redacted:TOKEN] b [redacted:SHORT] c");
  });

  it("catches a secret split across chunks, however the stream is cut", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 40 }), fc.string({ maxLength: 40 }), fc.array(fc.nat(80), { maxLength: 6 }), (before, after, cuts) => {
        const text = `${before}s3cr3t-value${after}`;
        const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const redactor = createStreamRedactor(secrets);
        let out = "";
        let from = 0;
        for (const point of [...points, text.length]) {
          out += redactor.push(text.slice(from, point));
          from = point;
        }
        out += redactor.flush();
        expect(out).toBe(redactSecrets(text, secrets));
        expect(out).not.toContain("s3cr3t");
      }),
    );
  });

  it("drops the possibly cut-into head of an output tail", () => {
    expect(redactOutputTail("3t-value\nline two s3cr3t", true, secrets)).toBe("line two [redacted:SHORT]");
    expect(redactOutputTail("whole s3cr3t-value", false, secrets)).toBe("whole [redacted:TOKEN]");
    expect(redactOutputTail("no secrets here", true, [])).toBe("no secrets here");
  });

  it("keeps text Postgres can store", () => {
    expect(storableText("a\0b")).toBe("a\u2400b");
  });
});
