// Issue #12, finding 4: the process backend fails closed. Without bubblewrap the sandbox agent
// refuses to start unless --allow-unsandboxed is given; under bubblewrap a command cannot read
// the agent's token from /proc, the control plane's .keel/ dev token, the embedded PostgreSQL's
// socket, or anything listening on the host's loopback; a network grant is refused. Each
// isolation check runs the same command without bubblewrap first, to show it would leak there.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { probeBubblewrap } from "../sandbox-agent/src/process/bubblewrap.js";
import { createProcessWorkspaceBackend, NETWORK_REFUSED } from "../sandbox-agent/src/process/process-workspace-backend.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceBackend, type WorkspaceSpec } from "../sandbox-agent/src/workspace-backend.js";
import { exited, KEEL_BIN, ROOT } from "./support/child-processes.js";

const never = new AbortController().signal;
const bubblewrap = await probeBubblewrap();
if (bubblewrap === undefined) console.warn("process-sandbox: bubblewrap is not usable here; the tests that run commands under it are skipped");

let dir: string;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "keel-process-sandbox-"));
});

afterAll(async () => {
  for (const child of children) {
    child.kill("SIGKILL");
    await exited(child);
  }
  await rm(dir, { recursive: true, force: true });
});

function spawnAgent(args: readonly string[], env: Record<string, string>): { child: ChildProcess; lines: string[] } {
  const child = spawn(process.execPath, [KEEL_BIN, "sandbox-agent", "--backend", "process", ...args], {
    cwd: ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(child);
  const lines: string[] = [];
  createInterface({ input: child.stdout }).on("line", (line) => lines.push(line));
  createInterface({ input: child.stderr }).on("line", (line) => lines.push(line));
  return { child, lines };
}

async function waitForLine(lines: string[], child: ChildProcess, match: (line: string) => boolean, timeoutMs = 30_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = lines.find(match);
    if (found !== undefined) return found;
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`no matching line (exit ${child.exitCode}); output:\n${lines.join("\n")}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("keel sandbox-agent --backend process without bubblewrap", () => {
  // A PATH on which there is no bwrap (node itself is started by its absolute path). No control
  // plane listens at the URL: what is asserted is whether the agent starts, not that it attaches.
  const controlPlane = "http://127.0.0.1:9";
  let noBwrapPath: string;

  beforeAll(async () => {
    noBwrapPath = path.join(dir, "empty-bin");
    await mkdir(noBwrapPath);
  });

  it("refuses to start, naming --allow-unsandboxed", async () => {
    const { child, lines } = spawnAgent(["--control-plane", controlPlane, "--host-id", "no-bwrap-refused", "--data-dir", path.join(dir, "agent-refused")], {
      PATH: noBwrapPath,
      KEEL_SANDBOX_TOKEN: "unused",
    });
    await exited(child);
    expect(child.exitCode).toBe(1);
    const output = lines.join("\n");
    expect(output).toContain("bubblewrap");
    expect(output).toContain("--allow-unsandboxed");
    expect(output).not.toContain("sandbox agent starting");
  });

  it("starts with --allow-unsandboxed, with a loud warning", async () => {
    const { child, lines } = spawnAgent(
      ["--control-plane", controlPlane, "--host-id", "no-bwrap-allowed", "--data-dir", path.join(dir, "agent-allowed"), "--allow-unsandboxed"],
      { PATH: noBwrapPath, KEEL_SANDBOX_TOKEN: "unused", KEEL_LOG_LEVEL: "info" },
    );
    const warning = await waitForLine(lines, child, (line) => line.includes("UNSANDBOXED"));
    expect(JSON.parse(warning)).toMatchObject({ level: 40 });
    await waitForLine(lines, child, (line) => line.includes("sandbox agent starting"));
    // Still running (trying to reach its control plane), not refused.
    await waitForLine(lines, child, (line) => line.includes("reconnecting to the control plane"));
    expect(child.exitCode).toBeNull();
    child.kill("SIGTERM");
    await exited(child);
  });
});

describe.skipIf(bubblewrap === undefined)("a command under bubblewrap", () => {
  const token = `keel-sandbox-token-${randomBytes(12).toString("hex")}`;
  const devToken = `keel-dev-token-${randomBytes(12).toString("hex")}`;
  let keelFolder: string;
  let standIn: ChildProcess;
  let listener: Server;
  let listenerPort: number;
  const backends: Record<"bubblewrap" | "none", WorkspaceBackend> = {} as Record<"bubblewrap" | "none", WorkspaceBackend>;
  const workspaceIds: Record<"bubblewrap" | "none", string> = { bubblewrap: `bwrap-${randomUUID().slice(0, 8)}`, none: `plain-${randomUUID().slice(0, 8)}` };

  const spec = (workspaceId: string, networkAccess = false): WorkspaceSpec => ({
    workspaceId,
    runId: `run-${workspaceId}`,
    image: "unused",
    networkAccess,
    env: { GRANTED: "granted-value" },
    limits: DEFAULT_WORKSPACE_LIMITS,
  });

  async function run(mode: "bubblewrap" | "none", script: string): Promise<{ exitCode: number; output: string }> {
    let output = "";
    const result = await backends[mode].exec(
      workspaceIds[mode],
      { commandId: randomUUID(), argv: ["bash", "-c", script], workingDirectory: "/workspace", env: {}, timeoutMs: 10_000, maxOutputBytes: 1 << 20 },
      (_stream, chunk) => {
        output += Buffer.from(chunk).toString("utf8");
      },
      never,
    );
    return { exitCode: result.exitCode, output };
  }

  beforeAll(async () => {
    // A control plane's .keel/ folder with its dev token, next to the sandbox agent's data.
    keelFolder = path.join(dir, "host", ".keel");
    await mkdir(keelFolder, { recursive: true });
    await writeFile(path.join(keelFolder, "dev-token"), `${devToken}\n`);
    // Stands in for the sandbox agent: a process of this user holding the token in its environment.
    standIn = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { env: { KEEL_SANDBOX_TOKEN: token }, stdio: "ignore" });
    children.add(standIn);
    listener = createServer((socket) => socket.end("host-loopback-service\n"));
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    listenerPort = (listener.address() as { port: number }).port;
    for (const mode of ["bubblewrap", "none"] as const) {
      backends[mode] = createProcessWorkspaceBackend({ workspaceRoot: path.join(dir, "host", ".keel-sandbox", mode), hostId: `host-${mode}`, sandbox: mode });
      await backends[mode].acquire(spec(workspaceIds[mode]), never);
    }
  });

  afterAll(async () => {
    for (const mode of ["bubblewrap", "none"] as const) {
      await backends[mode]?.release(workspaceIds[mode]);
      await backends[mode]?.close();
    }
    await new Promise((resolve) => listener?.close(resolve));
  });

  it("gets only the workspace's variables, not the agent's", async () => {
    const seen = await run("bubblewrap", "env");
    expect(seen.output).toContain("GRANTED=granted-value");
    expect(seen.output).not.toContain("KEEL_");
  });

  it("cannot read the agent's KEEL_SANDBOX_TOKEN from /proc/<pid>/environ", async () => {
    const script = `set -o pipefail; cat /proc/${standIn.pid}/environ | tr '\\0' '\\n'`;
    expect((await run("none", script)).output).toContain(token);
    const sandboxed = await run("bubblewrap", script);
    expect(sandboxed.output).not.toContain(token);
    expect(sandboxed.exitCode).not.toBe(0);
    // A fresh /proc: only the sandbox's own processes, none of the host's.
    const pids = (await run("bubblewrap", "ls /proc | grep -E '^[0-9]+$'")).output.split("\n").filter((line) => line !== "");
    expect(pids).not.toContain(String(standIn.pid));
    expect(pids.length).toBeLessThan(10);
  });

  it("cannot read the control plane's .keel/ dev token", async () => {
    const script = `cat ${path.join(keelFolder, "dev-token")}`;
    expect((await run("none", script)).output).toContain(devToken);
    const sandboxed = await run("bubblewrap", script);
    expect(sandboxed.output).not.toContain(devToken);
    expect(sandboxed.exitCode).not.toBe(0);
  });

  it("cannot reach a service on the host's loopback", async () => {
    const script = `exec 3<>/dev/tcp/127.0.0.1/${listenerPort} && head -n1 <&3`;
    expect((await run("none", script)).output).toContain("host-loopback-service");
    const sandboxed = await run("bubblewrap", script);
    expect(sandboxed.output).not.toContain("host-loopback-service");
    expect(sandboxed.exitCode).not.toBe(0);
  });

  it("cannot see the embedded PostgreSQL's socket nor reach its port over TCP", async () => {
    const url = new URL(inject("postgresUrl"));
    const socketDir = decodeURIComponent(url.hostname);
    expect(socketDir.startsWith("/"), `the test PostgreSQL is reached over its socket: ${url.hostname}`).toBe(true);
    const socket = path.join(socketDir, `.s.PGSQL.${url.port}`);
    expect((await run("none", `test -S ${socket} && echo present`)).output).toContain("present");
    expect((await run("bubblewrap", `test -S ${socket} && echo present`)).output).not.toContain("present");
    // Nothing listens on TCP for the embedded server: refused even without the sandbox.
    for (const mode of ["none", "bubblewrap"] as const) {
      const tcp = await run(mode, `exec 3<>/dev/tcp/127.0.0.1/${url.port} && echo connected`);
      expect(tcp.output, mode).not.toContain("connected");
    }
  });

  it("a network grant is refused on the process backend", async () => {
    await expect(backends.bubblewrap.acquire(spec(`net-${randomUUID().slice(0, 8)}`, true), never)).rejects.toThrow(NETWORK_REFUSED);
  });
});
