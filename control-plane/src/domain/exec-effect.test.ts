// Issue #12, finding 8: a "read" exec must not be able to write through its env or arguments.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { execEffect, shellWords } from "./exec-effect.js";

const READS = ["cat", "ls", "find", "sort", "git", "grep", "sleep", "env", "rg", "file", "date", "sed", "tree", "mytool"];
const grant = { toolName: "sandbox.exec.v1", connectors: [], readOnlyCommands: READS };

describe("execEffect: reads", () => {
  it("allows listed programs with harmless arguments", () => {
    for (const command of [
      "cat notes.txt",
      "ls -la /workspace",
      "find . -name '*.ts' -type f",
      "sort -n -k2 data.csv",
      "git status",
      "git log --oneline -5",
      "git diff HEAD~1 -- src",
      'grep -rn "hello world" .',
      "sleep 5",
      "ls *.txt",
      "date -u +%Y",
    ]) {
      expect(execEffect(command, grant), command).toBe("read");
    }
  });
});

describe("execEffect: writes", () => {
  it("the issue's cases: find -exec, sort -o, env X=1 cat", () => {
    expect(execEffect("find . -exec rm {} +", grant)).toBe("write");
    expect(execEffect("sort -o f f", grant)).toBe("write");
    expect(execEffect("env X=1 cat f", grant)).toBe("write");
  });

  it("options that write or run something, however spelled", () => {
    for (const command of [
      "find . -delete",
      "find . -execdir rm {} +",
      "find . -fprint out",
      "find . -fprintf out %p",
      "find . -fls out",
      "find . -ok rm {} +",
      "find . '-exec' rm {} +",
      'find . -ex""ec rm {} +',
      "find . -*",
      "sort -uo f f",
      "sort -of f",
      "sort --output=f f",
      "sort --out=f f",
      "sort --compress-program=sh f",
      "rg --pre ./run x",
      "file -C -m magic",
      "tree -o listing",
      "date -s 2020-01-01",
      "git -c core.pager=sh log",
      "git --config-env=core.pager=X log",
      "git -C /tmp status",
      "git commit -m x",
      "git checkout .",
      "git branch new",
      "git diff --output=f",
      "git diff --ext-diff",
      "git grep -O x",
      "git",
    ]) {
      expect(execEffect(command, grant), command).toBe("write");
    }
  });

  it("env set by the call or on the command line, expansions and unmodelled syntax", () => {
    expect(execEffect("cat f", grant, { LD_PRELOAD: "/workspace/x.so" })).toBe("write");
    for (const command of [
      "PATH=/workspace cat f",
      "GIT_CONFIG_COUNT=1 git status",
      "find . $ACTION",
      "find . ${X}",
      "cat \\-n f",
      "cat 'unterminated",
      'cat "$HOME"',
      "(rm x)",
      "ls; rm x",
      "ls && rm x",
      "ls | tee x",
      "ls > x",
      "ls `rm x`",
      "ls $(rm x)",
      "ls\nrm x",
    ]) {
      expect(execEffect(command, grant), command).toBe("write");
    }
  });

  it("programs not in the table, even when the agent declares them read-only", () => {
    for (const command of ["sed -n 1p f", "mytool --dry-run", "env", "/bin/cat f", "./cat f"]) {
      expect(execEffect(command, grant), command).toBe("write");
    }
    expect(execEffect("cat f", { ...grant, readOnlyCommands: ["ls"] })).toBe("write");
    expect(execEffect("cat f", undefined)).toBe("write");
  });

  it("any env makes any command a write", () => {
    const name = fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,15}$/);
    fc.assert(
      fc.property(fc.dictionary(name, fc.string({ maxLength: 20 }), { minKeys: 1, maxKeys: 4 }), fc.constantFrom("cat f", "ls", "git status", "sleep 1"), (env, command) => {
        expect(execEffect(command, grant, env)).toBe("write");
      }),
    );
  });

  it("a forbidden find or sort option anywhere among harmless arguments makes a write", () => {
    const harmless = fc.array(fc.constantFrom(".", "-name", "'*.ts'", "-type", "f", "-n", "data.csv", "-k2", "-r"), { maxLength: 6 });
    fc.assert(
      fc.property(
        harmless,
        harmless,
        fc.constantFrom(
          ["find", "-exec"],
          ["find", "-execdir"],
          ["find", "-delete"],
          ["find", "-fprint0"],
          ["sort", "-o"],
          ["sort", "--output=x"],
          ["sort", "-ro"],
        ),
        (before, after, [program, option]) => {
          const command = [program, ...before, option, ...after].join(" ");
          expect(execEffect(command, grant), command).toBe("write");
        },
      ),
    );
  });
});

describe("shellWords", () => {
  it("removes quotes and marks unquoted globs", () => {
    expect(shellWords(`find . -name '*.ts' "a b"c`)).toEqual([
      { text: "find", globbed: false },
      { text: ".", globbed: false },
      { text: "-name", globbed: false },
      { text: "*.ts", globbed: false },
      { text: "a bc", globbed: false },
    ]);
    expect(shellWords("ls *.txt")?.[1]).toEqual({ text: "*.txt", globbed: true });
    expect(shellWords("echo $X")).toBeUndefined();
  });
});
