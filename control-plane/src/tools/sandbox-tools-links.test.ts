// Issue #12 item 12: a path-prefix rule could be passed through a symbolic link inside an allowed
// folder (/workspace/public/link -> /workspace/private). Under such a rule the file tools check,
// with the host, that nothing on the path is a link before they read, write or list.
import { describe, expect, it } from "vitest";
import type { AgentSpec } from "../domain/agent.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import type { SandboxDispatcher } from "./sandbox-dispatcher.js";
import { createSandboxTools } from "./sandbox-tools.js";
import { createToolRegistry, type ToolExecutionContext } from "./tool-registry.js";

/** A host whose workspace has public/{link -> ../private (a link), notes.txt} and private/secret.txt. */
function fakeHost() {
  const tree: Record<string, { path: string; type: string; sizeBytes: number }[]> = {
    "/workspace": [
      { path: "/workspace/private", type: "directory", sizeBytes: 0 },
      { path: "/workspace/public", type: "directory", sizeBytes: 0 },
    ],
    "/workspace/public": [
      { path: "/workspace/public/link", type: "other", sizeBytes: 0 },
      { path: "/workspace/public/notes.txt", type: "file", sizeBytes: 5 },
    ],
  };
  const calls: string[] = [];
  const dispatcher = {
    workspaceFor: () => Promise.resolve("w1"),
    listFiles: (_w: string, path: string) => (calls.push(`list ${path}`), Promise.resolve(tree[path] ?? [])),
    readFile: (_w: string, path: string) => (calls.push(`read ${path}`), Promise.resolve(new TextEncoder().encode("data"))),
    writeFile: (_w: string, path: string) => (calls.push(`write ${path}`), Promise.resolve()),
  } as Partial<SandboxDispatcher> as SandboxDispatcher;
  return { dispatcher, calls };
}

const restricted: AgentSpec = {
  ...DEMO_AGENT,
  policy: { kind: "restriction", allowedTools: [], allowedEffects: [], pathRules: [{ field: "path", prefixes: ["/workspace/public"] }], networkAccess: false },
};

const contextFor = (agent: AgentSpec): ToolExecutionContext => ({
  runId: "r1",
  invocationId: "i1",
  signal: AbortSignal.timeout(5_000),
  grant: undefined,
  agent,
  observe: () => Promise.resolve(),
});

const call = async (tool: string, args: Record<string, unknown>, agent: AgentSpec) => {
  const host = fakeHost();
  const registry = createToolRegistry(createSandboxTools({ dispatcher: host.dispatcher, env: {}, defaultExecTimeoutMs: 1000, maxExecTimeoutMs: 5000, maxOutputBytes: 1024 }));
  const definition = registry.get(tool)!;
  const parsed = definition.schema.parse(args);
  const outcome = await definition.definition.execute(parsed, contextFor(agent)).then(
    (result) => result.text,
    (error: unknown) => `refused: ${error instanceof Error ? error.message : String(error)}`,
  );
  return { outcome, calls: host.calls };
};

describe("path rules and symbolic links", () => {
  it("refuses a read, write or listing through a link inside an allowed folder, before the host is asked for it", async () => {
    for (const [tool, args] of [
      ["sandbox.read_file.v1", { path: "/workspace/public/link/secret.txt" }],
      ["sandbox.write_file.v1", { path: "/workspace/public/link/secret.txt", content: "x" }],
      ["sandbox.list_files.v1", { path: "/workspace/public/link" }],
      ["sandbox.read_file.v1", { path: "/workspace/public/link" }],
    ] as const) {
      const { outcome, calls } = await call(tool, args, restricted);
      expect(outcome, `${tool} ${args.path}`).toMatch(/^refused: path .* goes through \/workspace\/public\/link, which is a link/);
      expect(calls.filter((c) => !c.startsWith("list ") || c === "list /workspace/public/link")).toEqual([]);
    }
  });

  it("lets real paths through, and checks nothing without a path rule", async () => {
    const allowed = await call("sandbox.read_file.v1", { path: "/workspace/public/notes.txt" }, restricted);
    expect(allowed.calls.at(-1)).toBe("read /workspace/public/notes.txt");
    // Writing a link's own name replaces it (the host never writes through it), so the name is not checked.
    const replaced = await call("sandbox.write_file.v1", { path: "/workspace/public/link", content: "x" }, restricted);
    expect(replaced.calls.at(-1)).toBe("write /workspace/public/link");
    const open = await call("sandbox.read_file.v1", { path: "/workspace/public/link/secret.txt" }, DEMO_AGENT);
    expect(open.calls).toEqual(["read /workspace/public/link/secret.txt"]);
  });
});
