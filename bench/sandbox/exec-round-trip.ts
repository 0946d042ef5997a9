// Phase 2: the exec round trip through control plane and agent, against raw dockerode in the
// same container, interleaved so drift hits both alike.
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type Dockerode from "dockerode";
import type { KeelApp } from "../../control-plane/src/app.js";
import type { SandboxExec } from "../../control-plane/src/tools/sandbox-dispatcher.js";
import { ms, summarize } from "../support.js";
import type { Options } from "./options.js";
import { rawExec } from "./raw-exec.js";

const PROGRESS_EVERY = 25;

export interface ExecPhase {
  readonly keel: number[];
  readonly raw: number[];
}

export async function execPhase(
  dispatcher: KeelApp["sandbox"]["dispatcher"],
  workspaceId: string,
  container: Dockerode.Container,
  maxOutputBytes: number,
  options: Options,
  progress: (line: string) => void,
): Promise<ExecPhase> {
  const argv = ["true"];
  const command: SandboxExec = { argv, workingDirectory: "/workspace", env: {}, timeoutMs: 30_000, maxOutputBytes };
  const viaKeel = async (): Promise<number> => {
    const started = performance.now();
    const result = await dispatcher.exec(workspaceId, randomUUID(), command, async () => {}, AbortSignal.timeout(60_000));
    const elapsed = performance.now() - started;
    if (result.exitCode !== 0 || result.timedOut) throw new Error(`exec through keel ended with exit code ${result.exitCode}${result.timedOut ? " (timed out)" : ""}`);
    return elapsed;
  };
  const viaDocker = async (): Promise<number> => {
    const started = performance.now();
    const { exitCode } = await rawExec(container, argv);
    const elapsed = performance.now() - started;
    if (exitCode !== 0) throw new Error(`raw exec ended with exit code ${exitCode ?? "none"}`);
    return elapsed;
  };

  for (let i = 0; i < options.warmup; i++) {
    await viaKeel();
    await viaDocker();
  }
  if (options.warmup > 0) progress(`exec warm-up: ${options.warmup} round trips each way`);
  const keel: number[] = [];
  const raw: number[] = [];
  for (let i = 0; i < options.execs; i++) {
    keel.push(await viaKeel());
    raw.push(await viaDocker());
    if ((i + 1) % PROGRESS_EVERY === 0 || i + 1 === options.execs) {
      const k = summarize(keel.slice(-PROGRESS_EVERY));
      const r = summarize(raw.slice(-PROGRESS_EVERY));
      progress(`exec ${i + 1}/${options.execs}; last ${Math.min(PROGRESS_EVERY, keel.length)}: keel p50 ${ms(k.p50)} ms, raw p50 ${ms(r.p50)} ms`);
    }
  }
  return { keel, raw };
}
