// Phase 1: warm-pool acquisition through the docker backend, and its baseline, a cold create +
// start of an equally hardened container straight through dockerode.
import { randomUUID } from "node:crypto";
import { chown, mkdir } from "node:fs/promises";
import path from "node:path";
import { performance } from "node:perf_hooks";
import type Dockerode from "dockerode";
import { hardenedContainerConfig, SANDBOX_USER } from "../../sandbox-agent/src/docker/container-config.js";
import { createDockerWorkspaceBackend } from "../../sandbox-agent/src/docker/docker-workspace-backend.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceSpec } from "../../sandbox-agent/src/workspace-backend.js";
import { ms, summarize } from "../support.js";
import type { Options } from "./options.js";

export async function warmPhase(docker: Dockerode, hostId: string, workspaceRoot: string, options: Options, progress: (line: string) => void): Promise<number[]> {
  const backend = createDockerWorkspaceBackend({
    docker,
    hostId,
    workspaceRoot,
    warmPool: [{ image: options.image, size: options.poolSize }],
    log: (line) => progress(`docker backend: ${line}`),
  });
  const idle = () => backend.poolStatus()[0]?.idle ?? 0;
  const samples: number[] = [];
  try {
    progress(`filling a warm pool of ${options.poolSize} for ${options.image}`);
    const warmup = Math.min(2, options.warmup);
    for (let i = 0; i < warmup + options.acquisitions; i++) {
      // Every take finds a full pool: the refill after the previous take has finished.
      await backend.poolsFilled();
      if (idle() !== options.poolSize) throw new Error(`the warm pool holds ${idle()} of ${options.poolSize} containers; its refill failed (see the log above)`);
      const spec: WorkspaceSpec = {
        workspaceId: randomUUID(),
        runId: randomUUID(),
        image: options.image,
        networkAccess: false,
        env: {},
        limits: DEFAULT_WORKSPACE_LIMITS,
      };
      const started = performance.now();
      await backend.acquire(spec, AbortSignal.timeout(120_000));
      const elapsed = performance.now() - started;
      // The refill pushes a new container only once it runs: one fewer idle means a warm take.
      if (idle() !== options.poolSize - 1) throw new Error(`acquisition ${i} was not served from the warm pool (idle ${idle()} of ${options.poolSize})`);
      if (i >= warmup) samples.push(elapsed);
      await backend.release(spec.workspaceId);
      if (samples.length > 0 && (samples.length % 10 === 0 || samples.length === options.acquisitions)) {
        const recent = summarize(samples.slice(-10));
        progress(`warm acquire ${samples.length}/${options.acquisitions}; last ${Math.min(10, samples.length)}: p50 ${ms(recent.p50)} ms, p99 ${ms(recent.p99)} ms`);
      }
    }
  } finally {
    await backend.close();
  }
  return samples;
}

export async function coldPhase(docker: Dockerode, hostId: string, root: string, options: Options, progress: (line: string) => void): Promise<number[]> {
  const samples: number[] = [];
  const warmup = Math.min(2, options.warmup);
  for (let i = 0; i < warmup + options.cold; i++) {
    // The folder is made outside the timed part: the baseline is dockerode's create + start alone.
    const folder = path.join(root, `w${i}`);
    await mkdir(folder, { recursive: true, mode: 0o700 });
    await chown(folder, SANDBOX_USER.uid, SANDBOX_USER.gid);
    const started = performance.now();
    // The backend's own container config, so the baseline cannot drift from what it creates.
    const container = await docker.createContainer(
      hardenedContainerConfig({
        image: options.image,
        limits: DEFAULT_WORKSPACE_LIMITS,
        networkAccess: false,
        hostFolder: folder,
        hostId,
        workspaceLabel: `cold-${i}`,
        runId: "",
        warm: false,
      }),
    );
    try {
      await container.start();
      if (i >= warmup) samples.push(performance.now() - started);
    } finally {
      await container.remove({ force: true });
    }
    if (samples.length > 0 && (samples.length % 10 === 0 || samples.length === options.cold)) {
      const recent = summarize(samples.slice(-10));
      progress(`cold create+start ${samples.length}/${options.cold}; last ${Math.min(10, samples.length)}: p50 ${ms(recent.p50)} ms, p99 ${ms(recent.p99)} ms`);
    }
  }
  return samples;
}
