import { describe, expect, it } from "vitest";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import type { SandboxDispatcher } from "./sandbox-dispatcher.js";
import { createSandboxTools, execResultText, grantFor } from "./sandbox-tools.js";
import { createToolRegistry } from "./tool-registry.js";

const unused = new Proxy({}, { get: () => () => Promise.reject(new Error("not called")) }) as SandboxDispatcher;
const registry = createToolRegistry(
  createSandboxTools({ dispatcher: unused, env: {}, defaultExecTimeoutMs: 1000, maxExecTimeoutMs: 5000, maxOutputBytes: 1024 }),
);
const agent = { ...DEMO_AGENT, sandbox: { ...DEMO_AGENT.sandbox, secrets: [{ envVar: "API_TOKEN", sourceEnv: "KEEL_SECRET_SOURCE_TOKEN" }] } };

describe("sandbox tools", () => {
  it("validates paths when the call is checked, and stores them resolved", () => {
    const schema = registry.get("sandbox.read_file.v1")!.schema;
    expect(schema.parse({ path: "src/../notes.txt" })).toEqual({ path: "/workspace/notes.txt" });
    const refused = schema.safeParse({ path: "../etc/shadow" });
    expect(refused.success).toBe(false);
    expect(refused.error?.issues[0]?.message).toMatch(/must stay inside \/workspace/);
    expect(registry.get("sandbox.exec.v1")!.schema.safeParse({ command: "ls", timeout_ms: 6000 }).success).toBe(false);
  });

  it("classifies an exec by its command and the agent's read-only programs", () => {
    const exec = registry.get("sandbox.exec.v1")!;
    const grant = { toolName: "sandbox.exec.v1", connectors: [], readOnlyCommands: ["cat"] };
    expect(registry.effectOf(exec, { command: "cat a.txt" }, grant)).toBe("read");
    expect(registry.effectOf(exec, { command: "cat a.txt > b.txt" }, grant)).toBe("write");
  });

  it("grants the run the secrets its agent names, from the control plane's environment", () => {
    expect(grantFor({ runId: "r", agent }, { KEEL_SECRET_SOURCE_TOKEN: "v" }).secrets).toEqual({ API_TOKEN: "v" });
    expect(() => grantFor({ runId: "r", agent }, {})).toThrow(/API_TOKEN from KEEL_SECRET_SOURCE_TOKEN, which is not set/);
  });

  it("shows the model how the command ended and the end of its output", () => {
    const base = { exitCode: 2, durationMs: 40, timedOut: false, outputTruncated: false };
    expect(execResultText({ ...base, outputBytes: 0, outputTail: "" }, 1024)).toBe("exit code 2; 40 ms\n(no output)");
    expect(execResultText({ ...base, outputBytes: 3, outputTail: "hi\n" }, 1024)).toBe("exit code 2; 40 ms\n--- output ---\nhi\n");
    expect(execResultText({ ...base, timedOut: true, outputTruncated: true, outputBytes: 1024, outputTail: "end\n" }, 1024)).toBe(
      "exit code 2; 40 ms; timed out and was killed; output truncated at 1024 bytes\n--- last 4 of 1024 output bytes ---\nend\n",
    );
  });
});
