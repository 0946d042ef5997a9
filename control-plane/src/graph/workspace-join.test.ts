// The join's reconciliation over an in-memory fleet: what it reads, writes and refuses. The real
// fleet (Docker workspaces on a sandbox agent) is test/work-graph-workspaces.test.ts.
import { describe, expect, it } from "vitest";
import type { JoinJob } from "./work-graph-ledger.js";
import { createWorkspaceJoin, type JoinWorkspaces } from "./workspace-join.js";

type Entry = { path: string; type: string; sizeBytes: number };

/** Workspaces as path → content (a `null` content is a link), one per run. */
function fleet(byRun: Record<string, Record<string, string | null>>) {
  const written = new Map<string, Map<string, string>>();
  const ids = new Map(Object.keys(byRun).map((runId) => [runId, `ws-${runId}`]));
  const filesOf = (workspaceId: string) => byRun[[...ids].find(([, id]) => id === workspaceId)?.[0] ?? ""] ?? {};
  const port: JoinWorkspaces = {
    existing: (runId) => Promise.resolve(ids.get(runId)),
    open: (runId) => Promise.resolve(`ws-${runId}`),
    listFiles(workspaceId, folder) {
      const entries = new Map<string, Entry>();
      for (const [file, content] of Object.entries(filesOf(workspaceId))) {
        if (!file.startsWith(`${folder}/`)) continue;
        const [name, ...rest] = file.slice(folder.length + 1).split("/");
        const at = `${folder}/${name}`;
        entries.set(at, rest.length > 0 ? { path: at, type: "directory", sizeBytes: 0 } : { path: at, type: content === null ? "other" : "file", sizeBytes: content?.length ?? 0 });
      }
      return Promise.resolve([...entries.values()]);
    },
    readFile: (workspaceId, file) => Promise.resolve(new TextEncoder().encode(filesOf(workspaceId)[file] ?? "")),
    writeFile(workspaceId, file, content) {
      written.set(workspaceId, (written.get(workspaceId) ?? new Map<string, string>()).set(file, new TextDecoder().decode(content)));
      return Promise.resolve();
    },
  };
  return { port, written };
}

const job = (inputs: { key: string; workspace: "active" | "gone" | "none" }[]): JoinJob => ({
  nodeId: "n-join",
  key: "join",
  rootRunId: "root",
  agentId: "agent",
  inputs: inputs.map((input) => ({ ...input, childRunId: input.key, output: `${input.key} done` })),
});

const signal = new AbortController().signal;

describe("workspace join", () => {
  it("writes each input's files into the root's workspace, nested folders included, the earlier input winning a conflict", async () => {
    const { port, written } = fleet({
      a: { "/workspace/src/a.ts": "A", "/workspace/shared": "from a", "/workspace/link": null },
      b: { "/workspace/src/deep/b.ts": "B", "/workspace/shared": "from b" },
    });
    const settled = await createWorkspaceJoin(port)(job([{ key: "a", workspace: "active" }, { key: "b", workspace: "active" }]), signal);
    expect(settled.status).toBe("succeeded");
    expect(Object.fromEntries(written.get("ws-root") ?? [])).toEqual({ "/workspace/src/a.ts": "A", "/workspace/shared": "from a", "/workspace/src/deep/b.ts": "B" });
    expect(settled.output).toContain('/workspace/shared: "a" kept; "b" left a different version');
    expect(settled.output).toContain('/workspace/link (in "a")');
    expect(settled.output).toContain("--- a ---\na done\n\n--- b ---\nb done");
  });

  it("carries nothing from an input that never placed a workspace, and places none for the root when nothing is to be written", async () => {
    const { port, written } = fleet({});
    const settled = await createWorkspaceJoin(port)(job([{ key: "a", workspace: "none" }, { key: "b", workspace: "none" }]), signal);
    expect(settled.status).toBe("succeeded");
    expect(written.size).toBe(0);
  });

  it("fails the join, saying which, when an input's workspace is gone", async () => {
    const { port, written } = fleet({ a: { "/workspace/a": "A" } });
    const settled = await createWorkspaceJoin(port)(job([{ key: "a", workspace: "active" }, { key: "b", workspace: "gone" }]), signal);
    expect(settled).toMatchObject({ status: "failed", output: expect.stringContaining(`the workspace of "b" is gone`) as unknown });
    expect(written.size).toBe(0);
  });

  it("fails the join when the inputs leave more than its limits, before writing anything", async () => {
    const { port, written } = fleet({ a: { "/workspace/1": "x", "/workspace/2": "y", "/workspace/3": "z" }, b: { "/workspace/big": "0123456789" } });
    const tooMany = await createWorkspaceJoin(port, { maxFiles: 2, maxFileBytes: 100, maxTotalBytes: 100 })(job([{ key: "a", workspace: "active" }]), signal);
    expect(tooMany.output).toMatch(/"a" left more than 2 files/);
    const tooBig = await createWorkspaceJoin(port, { maxFiles: 10, maxFileBytes: 5, maxTotalBytes: 100 })(job([{ key: "b", workspace: "active" }]), signal);
    expect(tooBig.output).toMatch(/"b" left \/workspace\/big of 10 bytes, over the 5-byte limit per file/);
    const tooMuch = await createWorkspaceJoin(port, { maxFiles: 10, maxFileBytes: 100, maxTotalBytes: 12 })(
      job([
        { key: "a", workspace: "active" },
        { key: "b", workspace: "active" },
      ]),
      signal,
    );
    expect(tooMuch.output).toMatch(/the inputs left more than 12 bytes in all/);
    expect([tooMany.status, tooBig.status, tooMuch.status]).toEqual(["failed", "failed", "failed"]);
    expect(written.size).toBe(0);
  });

  it("leaves the join for a later pass when the scheduler stops mid-way", async () => {
    const stop = new AbortController();
    const { port } = fleet({ a: { "/workspace/a": "A" } });
    const slow: JoinWorkspaces = { ...port, listFiles: (id, folder, s) => (stop.abort(new Error("stopped")), port.listFiles(id, folder, s)) };
    await expect(createWorkspaceJoin(slow)(job([{ key: "a", workspace: "active" }]), stop.signal)).rejects.toThrow("stopped");
  });
});
