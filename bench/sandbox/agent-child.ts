// The sandbox agent the benchmark attaches to its Keel: a real `keel sandbox-agent` child
// process with the docker backend.
import { spawn, type ChildProcess } from "node:child_process";
import { appendFileSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { KeelApp } from "../../control-plane/src/app.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
const ATTACH_TIMEOUT_MS = 60_000;

export interface AgentChild {
  readonly child: ChildProcess;
  /** Its last output lines, for error messages. */
  readonly output: string[];
  stop(): Promise<void>;
}

export function startAgent(options: { url: string; token: string; hostId: string; dataDir: string; image: string }): AgentChild {
  const child = spawn(
    process.execPath,
    [
      ...(process.env["KEEL_BENCH_AGENT_NODE_ARGS"]?.split(" ").filter(Boolean) ?? []),
      KEEL_BIN,
      "sandbox-agent",
      "--control-plane",
      options.url,
      "--host-id",
      options.hostId,
      "--data-dir",
      options.dataDir,
      "--capacity",
      "4",
      "--backend",
      "docker",
      "--image",
      options.image,
    ],
    // The token through the environment, as an operator would pass it.
    { cwd: ROOT, env: { ...process.env, KEEL_SANDBOX_TOKEN: options.token, KEEL_LOG_LEVEL: "warn" }, stdio: ["ignore", "pipe", "pipe"] },
  );
  const output: string[] = [];
  const logFile = process.env["KEEL_BENCH_AGENT_LOG"];
  const keep = (line: string) => {
    if (logFile !== undefined && logFile !== "") appendFileSync(logFile, `${Date.now()} ${line}\n`);
    output.push(line);
    if (output.length > 40) output.shift();
  };
  createInterface({ input: child.stdout }).on("line", keep);
  createInterface({ input: child.stderr }).on("line", keep);
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", () => resolve());
  });
  return {
    child,
    output,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

export async function waitAttached(app: KeelApp, agent: AgentChild, hostId: string): Promise<void> {
  const deadline = Date.now() + ATTACH_TIMEOUT_MS;
  while (!app.sandbox.hub.isAttached(hostId)) {
    if (agent.child.exitCode !== null || agent.child.signalCode !== null) {
      throw new Error(`the sandbox agent exited (${agent.child.exitCode ?? agent.child.signalCode}) before attaching; its output:\n${agent.output.join("\n")}`);
    }
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`the sandbox agent did not attach within ${ATTACH_TIMEOUT_MS / 1000} s; its output:\n${agent.output.join("\n")}`);
    await app.sandbox.hub.changed(Math.min(left, 250), AbortSignal.timeout(left));
  }
}
