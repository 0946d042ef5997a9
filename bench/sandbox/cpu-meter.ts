// Where a stream's CPU goes: this process (the control plane), the agent, PostgreSQL and the
// Docker engine, read from /proc; and an optional CPU profile of this process.
import { readdirSync, readFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { nodeCpuMs, postgresCpuMs, processCpuMs } from "../support.js";

/** CPU time (ms) each party spent in one timed section. */
export interface CpuLap {
  readonly controlPlane: number;
  readonly agent: number;
  readonly postgres: number;
  readonly docker: number;
}

/** The Docker engine's processes (the engine and the shims that carry exec output): their pids. */
function dockerPids(): number[] {
  try {
    return readdirSync("/proc")
      .filter((entry) => /^\d+$/.test(entry))
      .filter((entry) => {
        try {
          const comm = readFileSync(`/proc/${entry}/comm`, "utf8").trim();
          return comm === "dockerd" || comm === "containerd" || comm.startsWith("containerd-shim");
        } catch {
          return false;
        }
      })
      .map(Number);
  } catch {
    return [];
  }
}

/**
 * Splits the CPU a stream costs between this process (the control plane), the agent, PostgreSQL
 * and the Docker engine: a diagnostic beside the throughput, since on a shared machine CPU per MB
 * is steadier than wall time. Linux only (zeros elsewhere).
 */
export function cpuMeter(target: { agentPid: number | undefined; postgresDataDir: string }): { lap(): CpuLap } {
  const docker = dockerPids();
  const read = () => ({
    controlPlane: nodeCpuMs(),
    agent: target.agentPid === undefined ? 0 : processCpuMs(target.agentPid),
    postgres: postgresCpuMs(target.postgresDataDir),
    docker: new Map(docker.map((pid) => [pid, processCpuMs(pid)])),
  });
  let last = read();
  return {
    lap() {
      const now = read();
      let dockerMs = 0;
      // Only processes seen at both ends: a shim that exited meanwhile reads 0, not minus its total.
      for (const [pid, spent] of now.docker) if (spent > 0 && (last.docker.get(pid) ?? 0) > 0) dockerMs += spent - last.docker.get(pid)!;
      const lap = {
        controlPlane: now.controlPlane - last.controlPlane,
        agent: now.agent - last.agent,
        postgres: now.postgres - last.postgres,
        docker: dockerMs,
      };
      last = now;
      return lap;
    },
  };
}

/**
 * With KEEL_BENCH_PROFILE_DIR set, a CPU profile of this process (the control plane) over one
 * timed stream only (through keel, or discarding), written there as <name>-<time>.cpuprofile.
 */
export async function startProfile(name: string): Promise<{ stop(progress: (line: string) => void): Promise<void> } | undefined> {
  const dir = process.env["KEEL_BENCH_PROFILE_DIR"];
  if (dir === undefined || dir === "") return undefined;
  const { Session } = await import("node:inspector/promises");
  const session = new Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.start");
  return {
    async stop(progress) {
      const { profile } = await session.post("Profiler.stop");
      session.disconnect();
      await mkdir(dir, { recursive: true });
      const file = path.join(dir, `${name}-${Date.now()}.cpuprofile`);
      await writeFile(file, JSON.stringify(profile));
      progress(`CPU profile (${name}): ${file}`);
    },
  };
}
