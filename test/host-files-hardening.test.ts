// Issue #12 item 12, on a real folder with real links, FIFOs and processes: the host's file
// access never opens or looks up what a planted link points at outside the workspace (no
// existence oracle, no side effects of opening), never opens a FIFO or device, and lists a
// folder with a cap while streaming its names.
import { spawn } from "node:child_process";
import { mkdtemp, mkdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WorkspaceError } from "../sandbox-agent/src/workspace-backend.js";
import { listWorkspaceFiles, readWorkspaceFile, resolveWorkspaceDirectory, writeWorkspaceFile } from "../sandbox-agent/src/workspace-folder.js";

let folder: string;
beforeAll(async () => {
  folder = await mkdtemp(path.join(tmpdir(), "keel-host-files-"));
});
afterAll(async () => {
  await rm(folder, { recursive: true, force: true });
});

const reasonOf = (work: Promise<unknown>): Promise<string> =>
  work.then(
    () => "ok",
    (error: unknown) => (error instanceof WorkspaceError ? error.reason : `unexpected: ${String(error)}`),
  );

describe("host-side workspace file access", () => {
  it("answers the same for links out of the workspace whether or not their target exists", async () => {
    await symlink("/etc/passwd", path.join(folder, "to-existing"));
    await symlink("/nonexistent-keel-target", path.join(folder, "to-missing"));
    await symlink("/etc", path.join(folder, "dir-existing"));
    await symlink("/nonexistent-keel-dir", path.join(folder, "dir-missing"));
    await symlink("../../../../../../nonexistent-keel-dir", path.join(folder, "up-missing"));
    for (const p of ["to-existing", "to-missing", "dir-existing/passwd", "dir-missing/passwd", "up-missing/x"]) {
      expect(await reasonOf(readWorkspaceFile(folder, p, 1024)), p).toBe("path_outside_workspace");
    }
    for (const p of ["dir-existing", "dir-missing", "up-missing"]) {
      expect(await reasonOf(listWorkspaceFiles(folder, p)), p).toBe("path_outside_workspace");
      expect(await reasonOf(resolveWorkspaceDirectory(folder, p)), p).toBe("path_outside_workspace");
      expect(await reasonOf(writeWorkspaceFile(folder, `${p}/x`, new Uint8Array([1]))), p).toBe("path_outside_workspace");
    }
  });

  it("follows links that stay inside, relative or under /workspace", async () => {
    await mkdir(path.join(folder, "real"));
    await writeFile(path.join(folder, "real", "inner.txt"), "inner");
    await symlink("real", path.join(folder, "alias"));
    await symlink("/workspace/real/inner.txt", path.join(folder, "absolute-alias"));
    await symlink("../real", path.join(folder, "real", "self"));
    for (const p of ["alias/inner.txt", "absolute-alias", "/workspace/real/self/self/inner.txt"]) {
      expect(Buffer.from(await readWorkspaceFile(folder, p, 100)).toString(), p).toBe("inner");
    }
    await symlink("loop-b", path.join(folder, "loop-a"));
    await symlink("loop-a", path.join(folder, "loop-b"));
    expect(await reasonOf(readWorkspaceFile(folder, "loop-a", 100))).toBe("not_found");
  });

  it("never opens a FIFO: a writer blocked opening it stays blocked", async () => {
    const fifo = path.join(folder, "pipe");
    await new Promise<void>((resolve, reject) => spawn("mkfifo", [fifo]).on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`mkfifo ${code}`)))));
    await symlink("pipe", path.join(folder, "pipe-link"));
    // The writer's open() returns only once someone opens the FIFO for reading.
    const writer = spawn("sh", ["-c", `echo secret > ${fifo}`], { stdio: "ignore" });
    let exited = false;
    writer.on("exit", () => (exited = true));
    try {
      for (const p of ["pipe", "pipe-link"]) expect(await reasonOf(readWorkspaceFile(folder, p, 100)), p).toBe("not_found");
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(exited).toBe(false);
    } finally {
      writer.kill("SIGKILL");
    }
  });

  it("refuses a folder of more than 10,000 names as too_large", async () => {
    const big = path.join(folder, "big");
    await mkdir(big);
    for (let start = 0; start <= 10_000; start += 1_000) {
      await Promise.all(Array.from({ length: Math.min(1_000, 10_001 - start) }, (_, i) => writeFile(path.join(big, `f${start + i}`), "")));
    }
    const refused = await listWorkspaceFiles(folder, "big").then(
      () => undefined,
      (error: unknown) => error as WorkspaceError,
    );
    expect(refused?.reason).toBe("too_large");
    expect(refused?.message).toMatch(/more than 10000 entries/);
  });
});
