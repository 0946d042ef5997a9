// Real Keel processes for tests that kill them: spawn, wait until they listen, kill hard,
// and make sure none outlives its test file.
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { AgentSpec } from "../../control-plane/src/domain/agent.js";
import { createAgentRepository } from "../../control-plane/src/ledger/agent.repository.js";
import { createSqlPool } from "../../control-plane/src/ledger/sql.js";
import { createApiTokenRepository, type TokenRole } from "../../control-plane/src/ledger/api-token.repository.js";
import { migrateLedger } from "../../control-plane/src/ledger/orm.js";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
export const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
export const FAULT_SERVE = path.join(ROOT, "test", "support", "fault-serve.ts");

export interface ServerProcess {
  readonly url: string;
  readonly process: ChildProcess;
  /** Its stdout and stderr lines, newest last (at most `keepLines`). */
  readonly output: string[];
  alive(): boolean;
  kill(): Promise<void>;
}

const children = new Set<ChildProcess>();

export function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/** SIGKILL (after SIGCONT, so a stopped process goes too) and wait for the exit. */
export async function killHard(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill("SIGCONT");
    child.kill("SIGKILL");
  }
  await exited(child);
  children.delete(child);
}

/** For afterAll: no child outlives its test file. */
export async function killAllChildren(): Promise<void> {
  await Promise.all([...children].map((child) => killHard(child)));
}

/** How runScript marks a line that came on stderr. */
export const STDERR_MARK = "stderr: ";

export interface ScriptOutput {
  readonly code: number | null;
  /** Stdout and stderr lines as they came, each stderr line marked with STDERR_MARK. */
  readonly lines: readonly string[];
}

/**
 * Runs a TypeScript script (through tsx) to its end as its own process. Past `timeoutMs` it gets
 * SIGINT, so a script that handles it can stop what it started; `started` hands over the child
 * for an afterAll that must stop it if the test ends first.
 */
export function runScript(
  script: string,
  args: readonly string[],
  options: { readonly timeoutMs: number; readonly env?: NodeJS.ProcessEnv; readonly started?: (child: ChildProcess) => void },
): Promise<ScriptOutput> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", script, ...args], { cwd: ROOT, env: options.env ?? process.env, stdio: ["ignore", "pipe", "pipe"] });
    options.started?.(child);
    const lines: string[] = [];
    createInterface({ input: child.stdout }).on("line", (line) => lines.push(line));
    createInterface({ input: child.stderr }).on("line", (line) => lines.push(`${STDERR_MARK}${line}`));
    const timer = setTimeout(() => child.kill("SIGINT"), options.timeoutMs);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, lines });
    });
  });
}

export interface StartOptions {
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  /** Returns the server's URL once a line says it listens. */
  readonly listening: (line: string) => string | undefined;
  readonly timeoutMs?: number;
  readonly keepLines?: number;
}

/** Spawns `node <args>` and resolves once it listens; kills it if it dies or stalls first. */
export async function startServerProcess(options: StartOptions): Promise<ServerProcess> {
  const child = spawn(process.execPath, [...options.args], {
    cwd: ROOT,
    env: { ...process.env, KEEL_HOST: "127.0.0.1", KEEL_PORT: "0", KEEL_HTTP1_PORT: "0", ...options.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(child);
  child.once("exit", () => children.delete(child));
  const output: string[] = [];
  const keepLines = options.keepLines ?? 5_000;
  const keep = (line: string) => {
    output.push(line);
    if (output.length > keepLines) output.shift();
  };
  createInterface({ input: child.stderr }).on("line", keep);
  const timeoutMs = options.timeoutMs ?? 30_000;
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${options.args.join(" ")} did not listen within ${timeoutMs} ms:\n${output.join("\n")}`)), timeoutMs);
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`${options.args.join(" ")} exited before listening (code ${String(code)}, signal ${String(signal)}):\n${output.join("\n")}`));
      });
      createInterface({ input: child.stdout }).on("line", (line) => {
        keep(line);
        const url = options.listening(line);
        if (url !== undefined) {
          clearTimeout(timer);
          resolve(url);
        }
      });
    });
    return { url, process: child, output, alive: () => child.exitCode === null && child.signalCode === null, kill: () => killHard(child) };
  } catch (error) {
    await killHard(child);
    throw error;
  }
}

/** test/support/fault-serve.ts, which prints `LISTENING <url>`. */
export function startFaultServe(env: Readonly<Record<string, string>>, keepLines?: number): Promise<ServerProcess> {
  return startServerProcess({
    args: ["--import", "tsx", FAULT_SERVE],
    env,
    listening: (line) => (line.startsWith("LISTENING ") ? line.slice("LISTENING ".length).trim() : undefined),
    ...(keepLines === undefined ? {} : { keepLines }),
  });
}

/** `keel serve`, which logs `keel is serving` with its url as pino JSON. */
export function startKeelServe(args: readonly string[], env: Readonly<Record<string, string>>): Promise<ServerProcess> {
  return startServerProcess({
    args: [KEEL_BIN, "serve", ...args],
    env,
    listening: (line) => {
      try {
        const entry = JSON.parse(line) as Record<string, unknown>;
        return typeof entry["msg"] === "string" && entry["msg"].startsWith("keel is serving") && typeof entry["url"] === "string" ? entry["url"] : undefined;
      } catch {
        return undefined;
      }
    },
  });
}

/** Migrates a fresh database, stores the agents and makes a token, before any server starts (so none race to). */
export async function prepareLedger(databaseUrl: string, agents: readonly AgentSpec[], role: TokenRole = "admin"): Promise<string> {
  await migrateLedger({ url: databaseUrl });
  const sql = createSqlPool({ url: databaseUrl, max: 2 });
  try {
    for (const agent of agents) await createAgentRepository(sql).put(agent);
    return (await createApiTokenRepository(sql).create(role, "test")).secret;
  } finally {
    await sql.close();
  }
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
