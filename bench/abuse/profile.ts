// CPU profiles of the abuse bench's server process, one per phase (`--profile DIR`): where the
// event loop spends its time while refusing an attacker. Written as .cpuprofile files (open them
// in Chrome DevTools) and summarised as the functions with the most self time.
import { mkdir, writeFile } from "node:fs/promises";
import { Session, type Profiler } from "node:inspector";
import path from "node:path";

export interface PhaseProfiler {
  /** Starts sampling; the returned function stops it, writes the profile and returns a summary. */
  start(): Promise<(name: string) => Promise<string>>;
  close(): void;
}

function post<T>(session: Session, method: string, params?: object): Promise<T> {
  return new Promise((resolve, reject) => session.post(method, params ?? {}, (error, result) => (error === null ? resolve(result as T) : reject(error))));
}

/** Self time per function (name and file:line), largest first, as `share% name (where)` lines. */
export function summarizeProfile(profile: Profiler.Profile, top = 15): string[] {
  const selfByNode = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  samples.forEach((id, i) => selfByNode.set(id, (selfByNode.get(id) ?? 0) + (deltas[i] ?? 0)));
  const byFunction = new Map<string, number>();
  let total = 0;
  for (const node of profile.nodes) {
    const self = selfByNode.get(node.id) ?? 0;
    total += self;
    const frame = node.callFrame;
    const where = frame.url === "" ? "" : ` (${frame.url.replace(/^.*\/node_modules\//, "~/").replace(/^file:\/\/.*\/main\//, "")}:${frame.lineNumber + 1})`;
    const key = `${frame.functionName === "" ? "(anonymous)" : frame.functionName}${where}`;
    byFunction.set(key, (byFunction.get(key) ?? 0) + self);
  }
  return [...byFunction.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([key, self]) => `${((self / Math.max(total, 1)) * 100).toFixed(1).padStart(5)}%  ${key}`);
}

export function phaseProfiler(dir: string): PhaseProfiler {
  const session = new Session();
  session.connect();
  let enabled = false;
  return {
    async start() {
      if (!enabled) {
        await mkdir(dir, { recursive: true });
        await post(session, "Profiler.enable");
        await post(session, "Profiler.setSamplingInterval", { interval: 500 });
        enabled = true;
      }
      await post(session, "Profiler.start");
      return async (name) => {
        const { profile } = await post<{ profile: Profiler.Profile }>(session, "Profiler.stop");
        const file = path.join(dir, `${name.replace(/[^A-Za-z0-9]+/g, "-")}.cpuprofile`);
        await writeFile(file, JSON.stringify(profile));
        return [`profile ${file}, top self time:`, ...summarizeProfile(profile)].join("\n");
      };
    },
    close() {
      session.disconnect();
    },
  };
}
