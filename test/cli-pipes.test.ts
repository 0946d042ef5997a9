// `keel … | head -1` closes the pipe early: the CLI ends quietly instead of crashing on EPIPE.
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { KEEL_BIN } from "./support/child-processes.js";

describe("the keel CLI writing into a closed pipe", () => {
  it("exits with its own status and no unhandled EPIPE", async () => {
    const child = spawn(process.execPath, [KEEL_BIN, "--help"], { stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.destroy(); // the reader is gone before the first line
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    expect(stderr).not.toMatch(/EPIPE|Unhandled/);
    expect(code).toBe(0);
  }, 30_000);
});
