// The abuse bench's attacker as a child process (bench/abuse-flood.ts): started, awaited until its
// first connections are up (so a measured slice is under attack from its first call, not while
// the attacker is still loading), then stopped by closing its stdin; it answers with its counts.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const FLOOD_SCRIPT = fileURLToPath(new URL("../abuse-flood.ts", import.meta.url));

export type AttackMode = "uploads" | "tokens" | "both" | "spin";

export interface AttackSettings {
  readonly url: string;
  readonly rate: number;
  readonly uploaders: number;
  /** Calls the attacker makes on one connection before moving to a new one. */
  readonly perConnection: number;
  /** A command prefix (taskset) that runs the attacker on its own CPU. */
  readonly prefix: readonly string[];
}

export interface RunningAttack {
  /** Stops the attack; resolves with what the attacker sent and how the server answered. */
  stop(): Promise<Record<string, number>>;
}

/** Starts an attacker and resolves once it is attacking. */
export function startAttack(mode: AttackMode, settings: AttackSettings): Promise<RunningAttack> {
  const args = [FLOOD_SCRIPT, settings.url, mode, String(settings.rate), String(settings.uploaders), String(settings.perConnection)];
  const command = [...settings.prefix, process.execPath, "--import", "tsx", ...args];
  const child = spawn(command[0]!, command.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  let out = "";
  const exited = new Promise<Record<string, number>>((resolve, reject) => {
    child.on("error", reject);
    child.on("exit", (code) => {
      try {
        if (code !== 0) throw new Error(`the attacker exited with ${code}`);
        resolve(JSON.parse(out.trim().split("\n").pop() ?? "{}") as Record<string, number>);
      } catch (error) {
        reject(error instanceof Error ? error : new Error(String(error)));
      }
    });
  });
  exited.catch(() => {});
  return new Promise((resolve, reject) => {
    let ready = false;
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (ready || !out.includes("ready\n")) return;
      ready = true;
      resolve({
        stop: () => {
          child.stdin.end();
          return exited;
        },
      });
    });
    exited.then(() => reject(new Error("the attacker ended before it was ready")), reject);
  });
}
