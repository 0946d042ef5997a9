// One contract suite for the WorkspaceBackend port, run against every implementation
// (process/process-workspace-backend.test.ts, test/docker-workspace-backend.test.ts).
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DEFAULT_WORKSPACE_LIMITS,
  WorkspaceError,
  type ExecRequest,
  type ExecResult,
  type OutputStreamName,
  type WorkspaceBackend,
  type WorkspaceSpec,
} from "./workspace-backend.js";

export interface WorkspaceBackendContractOptions {
  /** Skips the whole suite; the reason is printed. */
  readonly skip?: string;
  /** Image named in the specs (the process backend ignores it). */
  readonly image?: string;
  /**
   * Set (to the reason) when commands share the host's filesystem, as the process backend
   * does without bubblewrap: a command can then reach another workspace's folder by its host
   * path, and the one test that proves it cannot is skipped with this reason printed.
   */
  readonly sharesHostFilesystem?: string;
}

export interface ExecOutcome {
  readonly result: ExecResult;
  readonly stdout: string;
  readonly stderr: string;
  readonly chunks: number;
  readonly forwardedBytes: number;
  readonly elapsedMs: number;
}

/** Runs a command and collects what the backend streamed. */
export async function runCommand(
  backend: WorkspaceBackend,
  workspaceId: string,
  argv: readonly string[],
  request: Partial<Omit<ExecRequest, "argv">> = {},
  signal: AbortSignal = new AbortController().signal,
): Promise<ExecOutcome> {
  const decoder = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  const text: Record<OutputStreamName, string> = { stdout: "", stderr: "" };
  let chunks = 0;
  let forwardedBytes = 0;
  const started = Date.now();
  const result = await backend.exec(
    workspaceId,
    {
      commandId: request.commandId ?? randomUUID(),
      argv,
      workingDirectory: request.workingDirectory ?? "/workspace",
      env: request.env ?? {},
      timeoutMs: request.timeoutMs ?? 20_000,
      maxOutputBytes: request.maxOutputBytes ?? 1024 * 1024,
      ...(request.outputBacklog === undefined ? {} : { outputBacklog: request.outputBacklog }),
    },
    (stream, chunk) => {
      expect(chunk).toBeInstanceOf(Uint8Array);
      chunks += 1;
      forwardedBytes += chunk.length;
      // Only keep a bounded prefix: some tests stream megabytes.
      if (text[stream].length < 65_536) text[stream] += decoder[stream].decode(chunk, { stream: true });
    },
    signal,
  );
  return { result, stdout: text.stdout, stderr: text.stderr, chunks, forwardedBytes, elapsedMs: Date.now() - started };
}

async function expectWorkspaceError(promise: Promise<unknown>, reason: WorkspaceError["reason"]): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error, `expected WorkspaceError(${reason})`).toBeInstanceOf(WorkspaceError);
  expect((error as WorkspaceError).reason).toBe(reason);
}

const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);
const text = (b: Uint8Array): string => new TextDecoder().decode(b);

export function describeWorkspaceBackendContract(name: string, make: () => Promise<WorkspaceBackend>, options: WorkspaceBackendContractOptions = {}): void {
  if (options.skip !== undefined) console.warn(`WorkspaceBackend contract (${name}) skipped: ${options.skip}`);

  describe.skipIf(options.skip !== undefined)(`WorkspaceBackend contract: ${name}`, () => {
    let backend: WorkspaceBackend;
    const created = new Set<string>();
    const never = new AbortController().signal;
    const hostOnlyVariable = `KEEL_CONTRACT_HOST_ONLY_${randomUUID().slice(0, 8).toUpperCase()}`;
    const prefix = `contract-${randomUUID().slice(0, 8)}`;

    function spec(label: string, overrides: Partial<WorkspaceSpec> = {}): WorkspaceSpec {
      const workspaceId = overrides.workspaceId ?? `${prefix}-${label}`;
      created.add(workspaceId);
      return {
        workspaceId,
        runId: `run-${label}`,
        image: options.image ?? "keel/sandbox-base:busybox",
        networkAccess: false,
        env: {},
        limits: DEFAULT_WORKSPACE_LIMITS,
        ...overrides,
      };
    }

    async function workspace(label: string, overrides: Partial<WorkspaceSpec> = {}): Promise<string> {
      const s = spec(label, overrides);
      await backend.acquire(s, never);
      return s.workspaceId;
    }

    beforeAll(async () => {
      process.env[hostOnlyVariable] = "host-only-value";
      backend = await make();
    });

    afterAll(async () => {
      delete process.env[hostOnlyVariable];
      if (backend === undefined) return;
      for (const id of created) await backend.release(id);
      await backend.close();
    });

    it("acquire is idempotent on the workspace id", async () => {
      const s = spec("idempotent");
      await backend.acquire(s, never);
      await backend.writeFile(s.workspaceId, "kept.txt", bytes("still here"));
      await Promise.all([backend.acquire(s, never), backend.acquire(s, never)]);
      await backend.acquire(s, never);
      expect(text(await backend.readFile(s.workspaceId, "kept.txt", 1024))).toBe("still here");
      const mine = (await backend.list()).filter((w) => w.workspaceId === s.workspaceId);
      expect(mine).toEqual([{ workspaceId: s.workspaceId, runId: "run-idempotent" }]);
    });

    it("streams stdout and stderr separately and returns the exit code", async () => {
      const id = await workspace("streams");
      await backend.writeFile(id, "f", bytes("from the file\n"));
      const outcome = await runCommand(backend, id, ["sh", "-c", "cat f; echo err >&2; exit 3"]);
      expect(outcome.stdout).toBe("from the file\n");
      expect(outcome.stderr).toBe("err\n");
      expect(outcome.result).toMatchObject({ exitCode: 3, timedOut: false, outputTruncated: false });
      expect(outcome.result.durationMs).toBeGreaterThanOrEqual(0);

      const ok = await runCommand(backend, id, ["sh", "-c", "echo fine"]);
      expect(ok.result.exitCode).toBe(0);
      expect(ok.stdout).toBe("fine\n");
    });

    it("streams output as it comes, in chunks, before the command ends", async () => {
      const id = await workspace("chunks");
      const seen: number[] = [];
      const started = Date.now();
      const result = await backend.exec(
        id,
        { commandId: "c1", argv: ["sh", "-c", "echo one; sleep 1; echo two"], workingDirectory: ".", env: {}, timeoutMs: 10_000, maxOutputBytes: 1024 },
        () => seen.push(Date.now() - started),
        never,
      );
      expect(result.exitCode).toBe(0);
      expect(seen.length).toBeGreaterThanOrEqual(2);
      // The first chunk arrived well before the command finished.
      expect(seen[0]!).toBeLessThan(result.durationMs - 500);
    });

    it("runs commands in the working directory, inside /workspace", async () => {
      const id = await workspace("cwd");
      await backend.writeFile(id, "sub/dir/marker.txt", bytes("in sub/dir"));
      for (const wd of ["sub/dir", "/workspace/sub/dir", "./sub/../sub/dir/"]) {
        const outcome = await runCommand(backend, id, ["cat", "marker.txt"], { workingDirectory: wd });
        expect(outcome.stdout, wd).toBe("in sub/dir");
      }
      const top = await runCommand(backend, id, ["ls"], { workingDirectory: "/workspace" });
      expect(top.stdout.split("\n")).toContain("sub");
      const relative = await runCommand(backend, id, ["sh", "-c", "echo made > here.txt"], { workingDirectory: "sub" });
      expect(relative.result.exitCode).toBe(0);
      expect(text(await backend.readFile(id, "/workspace/sub/here.txt", 100))).toBe("made\n");
      await expectWorkspaceError(runCommand(backend, id, ["true"], { workingDirectory: "missing" }), "not_found");
    });

    it("refuses paths outside /workspace for read, write, list and the working directory", async () => {
      const id = await workspace("traversal");
      const outsidePaths = ["../x", "/etc/passwd", "/workspace/../etc/passwd", "a/../../x", "/", "/tmp/x", "/workspacex/y", ".."];
      for (const p of outsidePaths) {
        await expectWorkspaceError(backend.readFile(id, p, 1024), "path_outside_workspace");
        await expectWorkspaceError(backend.writeFile(id, p, bytes("x")), "path_outside_workspace");
        await expectWorkspaceError(backend.listFiles(id, p), "path_outside_workspace");
        await expectWorkspaceError(runCommand(backend, id, ["true"], { workingDirectory: p }), "path_outside_workspace");
      }
    });

    it("refuses symlinks that lead out of the workspace", async () => {
      const id = await workspace("symlinks");
      const made = await runCommand(backend, id, ["sh", "-c", "ln -s / root-link && ln -s .. up && ln -s /etc/passwd pw && mkdir -p d && ln -s ../.. d/upup"]);
      expect(made.result.exitCode).toBe(0);
      for (const p of ["root-link/etc/passwd", "pw", "up/x", "d/upup/etc/passwd"]) {
        await expectWorkspaceError(backend.readFile(id, p, 1_000_000), "path_outside_workspace");
      }
      for (const p of ["root-link", "up", "d/upup", "root-link/etc"]) {
        await expectWorkspaceError(backend.listFiles(id, p), "path_outside_workspace");
        await expectWorkspaceError(runCommand(backend, id, ["true"], { workingDirectory: p }), "path_outside_workspace");
      }
      for (const p of ["root-link/tmp/keel-contract-escape", "up/keel-contract-escape", "d/upup/tmp/keel-contract-escape"]) {
        await expectWorkspaceError(backend.writeFile(id, p, bytes("x")), "path_outside_workspace");
      }
      // Writing to a symlink's own name replaces the link inside the workspace; it never writes through it.
      await backend.writeFile(id, "pw", bytes("replaced"));
      expect(text(await backend.readFile(id, "pw", 100))).toBe("replaced");
      // A symlink that stays inside is fine.
      await backend.writeFile(id, "real/inner.txt", bytes("inner"));
      expect((await runCommand(backend, id, ["ln", "-s", "real", "alias"])).result.exitCode).toBe(0);
      expect(text(await backend.readFile(id, "alias/inner.txt", 100))).toBe("inner");
      const listed = await backend.listFiles(id, "/workspace");
      expect(listed.find((e) => e.path === "/workspace/alias")?.type).toBe("other");
    });

    it("truncates output past maxOutputBytes and marks it", async () => {
      const id = await workspace("truncate");
      const outcome = await runCommand(backend, id, ["sh", "-c", "head -c 50000 /dev/zero; head -c 50000 /dev/zero >&2; echo done >&2"], { maxOutputBytes: 3000 });
      expect(outcome.forwardedBytes).toBe(3000);
      expect(outcome.result).toMatchObject({ exitCode: 0, timedOut: false, outputTruncated: true });

      const exact = await runCommand(backend, id, ["printf", "abc"], { maxOutputBytes: 3 });
      expect(exact.stdout).toBe("abc");
      expect(exact.result.outputTruncated).toBe(false);
    });

    it("delivers all output, in order, when its consumer holds it back for a while (issue #4)", async () => {
      const id = await workspace("backlog");
      let holds = 0;
      const outcome = await runCommand(backend, id, ["sh", "-c", "seq 1 300000; echo end"], {
        maxOutputBytes: 8 * 1024 * 1024,
        // Behind for the first few chunks: a backend may stop reading meanwhile, and loses nothing.
        outputBacklog: () => (holds++ < 3 ? new Promise((resolve) => setTimeout(resolve, 200)) : undefined),
      });
      expect(outcome.result).toMatchObject({ exitCode: 0, timedOut: false, outputTruncated: false });
      const expected = Array.from({ length: 300_000 }, (_, i) => `${i + 1}\n`).join("") + "end\n";
      expect(outcome.forwardedBytes).toBe(expected.length);
      expect(outcome.stdout).toBe(expected.slice(0, outcome.stdout.length));
    });

    it("still kills a command past its timeout promptly while its consumer holds the output back", async () => {
      const id = await workspace("backlog-timeout");
      const never = new Promise<void>(() => {});
      const outcome = await runCommand(backend, id, ["sh", "-c", "while :; do echo 0123456789abcdef0123456789abcdef; done"], {
        timeoutMs: 1000,
        outputBacklog: () => never,
      });
      expect(outcome.result.timedOut).toBe(true);
      expect(outcome.elapsedMs).toBeLessThan(4000);
      const after = await runCommand(backend, id, ["sh", "-c", "echo alive"]);
      expect(after.stdout).toBe("alive\n");
    });

    it("kills a command past its timeout promptly and marks it timed out", async () => {
      const id = await workspace("timeout");
      for (const argv of [["sleep", "30"], ["sh", "-c", "sleep 30; echo never"]]) {
        const outcome = await runCommand(backend, id, argv, { timeoutMs: 1000 });
        expect(outcome.result.timedOut, argv.join(" ")).toBe(true);
        expect(outcome.result.exitCode).not.toBe(0);
        expect(outcome.stdout).not.toContain("never");
        expect(outcome.elapsedMs).toBeLessThan(3000);
      }
      // The workspace still works, and nothing of the killed commands is left running.
      const after = await runCommand(backend, id, ["sh", "-c", "echo alive"]);
      expect(after.stdout).toBe("alive\n");
    });

    it("aborting the signal kills the command and rejects", async () => {
      const id = await workspace("abort");
      const controller = new AbortController();
      const started = Date.now();
      setTimeout(() => controller.abort(new Error("cancelled by test")), 300);
      await expect(runCommand(backend, id, ["sh", "-c", "sleep 30"], { timeoutMs: 20_000 }, controller.signal)).rejects.toThrow("cancelled by test");
      expect(Date.now() - started).toBeLessThan(3000);
    });

    it("passes the spec env and the request env to commands, and not the host's environment", async () => {
      const id = await workspace("env", { env: { KEEL_GRANTED: "granted-value", KEEL_BOTH: "from-spec" } });
      const other = await workspace("env-other");
      const outcome = await runCommand(backend, id, ["env"], { env: { KEEL_BOTH: "from-request", KEEL_REQUEST_ONLY: "r" } });
      const lines = outcome.stdout.split("\n");
      expect(lines).toContain("KEEL_GRANTED=granted-value");
      expect(lines).toContain("KEEL_BOTH=from-request");
      expect(lines).toContain("KEEL_REQUEST_ONLY=r");
      expect(outcome.stdout).not.toContain(hostOnlyVariable);
      expect(outcome.stdout).not.toContain("host-only-value");
      const otherOutcome = await runCommand(backend, other, ["env"]);
      expect(otherOutcome.stdout).not.toContain("granted-value");
      expect(otherOutcome.stdout).not.toContain(hostOnlyVariable);
    });

    it("reads, writes and lists files", async () => {
      const id = await workspace("files");
      await backend.writeFile(id, "dir/a.txt", bytes("alpha"));
      await backend.writeFile(id, "/workspace/dir/b.bin", new Uint8Array([0, 1, 2, 255]));
      expect(text(await backend.readFile(id, "dir/a.txt", 5))).toBe("alpha");
      expect([...(await backend.readFile(id, "dir/b.bin", 100))]).toEqual([0, 1, 2, 255]);
      await expectWorkspaceError(backend.readFile(id, "dir/a.txt", 4), "too_large");
      await expectWorkspaceError(backend.readFile(id, "dir/missing.txt", 4), "not_found");
      await expectWorkspaceError(backend.listFiles(id, "nowhere"), "not_found");
      expect(await backend.listFiles(id, "dir")).toEqual([
        { path: "/workspace/dir/a.txt", type: "file", sizeBytes: 5 },
        { path: "/workspace/dir/b.bin", type: "file", sizeBytes: 4 },
      ]);
      expect((await backend.listFiles(id, "/workspace")).find((e) => e.path === "/workspace/dir")?.type).toBe("directory");
      // Files the host wrote are the command's to change, and the other way round.
      const appended = await runCommand(backend, id, ["sh", "-c", "echo more >> dir/a.txt && mkdir -p dir/new && echo cmd > dir/new/c.txt"]);
      expect(appended.result.exitCode).toBe(0);
      expect(text(await backend.readFile(id, "dir/a.txt", 100))).toBe("alphamore\n");
      expect(text(await backend.readFile(id, "dir/new/c.txt", 100))).toBe("cmd\n");
      await backend.writeFile(id, "dir/new/c.txt", bytes("overwritten"));
      expect((await runCommand(backend, id, ["cat", "dir/new/c.txt"])).stdout).toBe("overwritten");
    });

    it("two workspaces never see each other's files", async () => {
      const a = await workspace("iso-a");
      const b = await workspace("iso-b");
      await backend.writeFile(a, "secret.txt", bytes("a's secret"));
      await expectWorkspaceError(backend.readFile(b, "secret.txt", 100), "not_found");
      expect((await backend.listFiles(b, "/workspace")).map((e) => e.path)).not.toContain("/workspace/secret.txt");
      const listing = await runCommand(backend, b, ["ls", "-a"]);
      expect(listing.stdout).not.toContain("secret.txt");
    });

    it.skipIf(options.sharesHostFilesystem !== undefined)("a command cannot reach another workspace's files by the path it sees them at", async () => {
      const a = await workspace("reach-a");
      const b = await workspace("reach-b");
      await backend.writeFile(a, "secret.txt", bytes("a's secret"));
      const where = (await runCommand(backend, a, ["pwd"])).stdout.trim();
      const attempt = await runCommand(backend, b, ["cat", `${where}/secret.txt`]);
      expect(attempt.result.exitCode).not.toBe(0);
      expect(attempt.stdout).not.toContain("a's secret");
    });
    if (options.sharesHostFilesystem !== undefined) console.warn(`WorkspaceBackend contract (${name}): cross-workspace command test skipped: ${options.sharesHostFilesystem}`);

    it("list() reports the workspaces and reap() removes those keep() rejects", async () => {
      const keepId = await workspace("reap-keep");
      const dropId = await workspace("reap-drop");
      await backend.writeFile(dropId, "x.txt", bytes("x"));
      const listed = await backend.list();
      expect(listed).toContainEqual({ workspaceId: keepId, runId: "run-reap-keep" });
      expect(listed).toContainEqual({ workspaceId: dropId, runId: "run-reap-drop" });

      const removed = await backend.reap((workspaceId) => workspaceId !== dropId);
      expect(removed).toEqual([dropId]);
      const after = (await backend.list()).map((w) => w.workspaceId);
      expect(after).toContain(keepId);
      expect(after).not.toContain(dropId);
      await expectWorkspaceError(backend.readFile(dropId, "x.txt", 10), "not_found");
      expect((await runCommand(backend, keepId, ["echo", "kept"])).stdout).toBe("kept\n");
    });

    it("release removes the workspace; releasing again is a no-op", async () => {
      const id = await workspace("release");
      await backend.writeFile(id, "x.txt", bytes("x"));
      await backend.release(id);
      expect((await backend.list()).map((w) => w.workspaceId)).not.toContain(id);
      await expectWorkspaceError(backend.readFile(id, "x.txt", 10), "not_found");
      await expectWorkspaceError(runCommand(backend, id, ["true"]), "not_found");
      await backend.release(id);
      // The id can be acquired afresh, empty.
      await backend.acquire(spec("release"), never);
      expect(await backend.listFiles(id, "/workspace")).toEqual([]);
    });

    it("unknown workspaces are not found", async () => {
      const id = `${prefix}-never-acquired`;
      await expectWorkspaceError(runCommand(backend, id, ["true"]), "not_found");
      await expectWorkspaceError(backend.readFile(id, "x", 10), "not_found");
      await expectWorkspaceError(backend.writeFile(id, "x", bytes("x")), "not_found");
      await expectWorkspaceError(backend.listFiles(id, "/workspace"), "not_found");
    });
  });
}
