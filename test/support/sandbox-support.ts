// Real sandbox hosts for integration tests: `keel sandbox-agent` child processes on the Docker
// engine, and the checks that decide whether a Docker test runs, skips (printing why) or,
// with KEEL_REQUIRE_DOCKER=1, fails.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { Writable } from "node:stream";
import { createInterface } from "node:readline";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { pino, type Logger } from "pino";
import { describe, it } from "vitest";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
export const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
export const SANDBOX_IMAGE = "keel/sandbox-base:busybox";

function run(command: string, args: string[]): string | undefined {
  try {
    execFileSync(command, args, { stdio: "pipe", timeout: 20_000 });
    return undefined;
  } catch (error) {
    const stderr = typeof error === "object" && error !== null && "stderr" in error ? String(error.stderr).trim() : "";
    return stderr !== "" ? stderr.split("\n").slice(-1)[0] : error instanceof Error ? error.message : String(error);
  }
}

/** Why Docker tests cannot run here, or undefined when they can. */
export function whyDockerIsUnavailable(): string | undefined {
  const info = run("docker", ["info"]);
  if (info !== undefined) return `\`docker info\` failed (${info}); start the engine with scripts/start-dockerd.sh`;
  const image = run("docker", ["image", "inspect", SANDBOX_IMAGE]);
  if (image !== undefined) return `image ${SANDBOX_IMAGE} is missing; build it with scripts/build-sandbox-image.sh`;
  return undefined;
}

/**
 * Returns true when the file's Docker tests should be skipped. Without an engine the reason is
 * printed; with KEEL_REQUIRE_DOCKER=1 a failing test is registered instead of skipping.
 */
export function skipWithoutDocker(suite: string): boolean {
  const unavailable = whyDockerIsUnavailable();
  if (unavailable === undefined) return false;
  if (process.env["KEEL_REQUIRE_DOCKER"] === "1") {
    describe(suite, () => {
      it("needs a Docker engine (KEEL_REQUIRE_DOCKER=1)", () => {
        throw new Error(unavailable);
      });
    });
  } else {
    console.warn(`${suite} skipped: ${unavailable}`);
  }
  return true;
}

/** Containers of a sandbox host, by the label every workspace container carries. */
export function containersOfHost(hostId: string, runningOnly = false): string[] {
  const args = ["ps", "-q", ...(runningOnly ? [] : ["-a"]), "--filter", `label=keel.host-id=${hostId}`];
  return execFileSync("docker", args, { encoding: "utf8" }).split("\n").filter((line) => line.trim() !== "");
}

/**
 * Test cleanup: removes a host's containers. The host's own reaper or pool may be removing
 * some at the same moment ("removal already in progress", "no such container"), so a failed
 * `docker rm` is retried until none is left, and fails only if some container outlives that.
 */
export function removeContainersOfHost(hostId: string): void {
  for (let attempt = 0; ; attempt++) {
    const ids = containersOfHost(hostId);
    if (ids.length === 0) return;
    try {
      execFileSync("docker", ["rm", "-f", ...ids], { stdio: "ignore" });
    } catch (error) {
      if (attempt >= 20) throw error;
      execFileSync("sleep", ["0.25"]);
    }
  }
}

export const uniqueHostId = (label: string) => `test-${label}-${randomBytes(4).toString("hex")}`;

/** Lines a process or logger wrote, kept for assertions (the canary must never be in them). */
export class CapturedLog {
  readonly lines: string[] = [];
  text(): string {
    return this.lines.join("\n");
  }
  /** A pino logger writing here. */
  logger(level = "debug"): Logger {
    const lines = this.lines;
    const stream = new Writable({
      write(chunk: Buffer, _encoding, done) {
        lines.push(...chunk.toString("utf8").split("\n").filter((l) => l !== ""));
        done();
      },
    });
    return pino({ level }, stream);
  }
}

export interface AgentProcess {
  readonly hostId: string;
  readonly process: ChildProcess;
  readonly log: CapturedLog;
  /** Resolves once a JSON log line matches. */
  waitForLog(match: (entry: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

const children = new Set<ChildProcess>();

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/** Kills every child a test left running (afterAll). */
export async function killAllChildren(): Promise<void> {
  for (const child of [...children]) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited(child);
    children.delete(child);
  }
}

export interface StartAgentOptions {
  readonly url: string;
  readonly token: string;
  readonly hostId: string;
  readonly dataDir: string;
  readonly capacity?: number;
  readonly labels?: readonly string[];
  /** Capture into an existing log (a restarted agent keeps adding to the same one). */
  readonly log?: CapturedLog;
  /** Default docker; process needs bubblewrap. */
  readonly backend?: "docker" | "process";
  /** Further control-plane URLs, each as another --control-plane after `url`: the agent re-attaches to the next when one goes. */
  readonly moreUrls?: readonly string[];
  /** The agent's KEEL_LOG_LEVEL (default debug: tests wait for its debug lines). */
  readonly logLevel?: string;
}

/** `node bin/keel.js sandbox-agent ...`, resolved once it has attached to the control plane. */
export async function startSandboxAgent(options: StartAgentOptions): Promise<AgentProcess> {
  const args = [
    KEEL_BIN,
    "sandbox-agent",
    "--control-plane",
    options.url,
    ...(options.moreUrls ?? []).flatMap((url) => ["--control-plane", url]),
    "--host-id",
    options.hostId,
    "--data-dir",
    options.dataDir,
    "--capacity",
    String(options.capacity ?? 4),
    "--backend",
    options.backend ?? "docker",
    ...(options.labels ?? []).flatMap((label) => ["--label", label]),
  ];
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    env: { ...process.env, KEEL_SANDBOX_TOKEN: options.token, KEEL_LOG_LEVEL: options.logLevel ?? "debug" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(child);
  const log = options.log ?? new CapturedLog();
  const entries: Record<string, unknown>[] = [];
  const waiters = new Set<(entry: Record<string, unknown>) => void>();
  createInterface({ input: child.stdout }).on("line", (line) => {
    log.lines.push(line);
    try {
      const entry = JSON.parse(line) as Record<string, unknown>;
      entries.push(entry);
      for (const waiter of [...waiters]) waiter(entry);
    } catch {
      // not a log line
    }
  });
  createInterface({ input: child.stderr }).on("line", (line) => log.lines.push(line));

  const waitForLog = (match: (entry: Record<string, unknown>) => boolean, timeoutMs = 30_000) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const found = entries.find(match);
      if (found !== undefined) return resolve(found);
      const timer = setTimeout(() => {
        waiters.delete(check);
        reject(new Error(`sandbox agent ${options.hostId}: no matching log line within ${timeoutMs} ms; its log:\n${log.lines.slice(-30).join("\n")}`));
      }, timeoutMs);
      const onExit = () => {
        clearTimeout(timer);
        waiters.delete(check);
        reject(new Error(`sandbox agent ${options.hostId} exited; its log:\n${log.lines.slice(-30).join("\n")}`));
      };
      function check(entry: Record<string, unknown>) {
        if (!match(entry)) return;
        clearTimeout(timer);
        waiters.delete(check);
        child.off("exit", onExit);
        resolve(entry);
      }
      waiters.add(check);
      child.once("exit", onExit);
    });

  const agent: AgentProcess = {
    hostId: options.hostId,
    process: child,
    log,
    waitForLog,
    async kill(signal = "SIGKILL") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited(child);
      children.delete(child);
    },
  };
  await waitForLog((entry) => entry["msg"] === "attached to the control plane");
  return agent;
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
