// CPU pinning for the abuse bench. On a small machine the attacker process would compete with the
// server for the same cores, which a remote attacker does not: its cost would be counted as the
// server's. So, when there are at least two CPUs and `taskset` exists, the bench process (Keel,
// its in-process authorized client, and the PostgreSQL it starts afterwards, which inherits the
// mask) runs on one CPU and the attacker on another, in every phase including idle.
import { execFileSync } from "node:child_process";
import { availableParallelism } from "node:os";

export interface Pinning {
  /** The command prefix that runs the attacker on its own CPU, or [] when not pinned. */
  readonly attackerPrefix: readonly string[];
  /** One line for the report header saying what runs where. */
  readonly describe: string;
}

function hasTaskset(): boolean {
  try {
    execFileSync("taskset", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** The CPUs this process may run on, e.g. [0, 1]. */
function allowedCpus(): number[] {
  const out = execFileSync("taskset", ["-c", "-p", String(process.pid)], { encoding: "utf8" });
  const list = out.slice(out.lastIndexOf(":") + 1).trim();
  return list.split(",").flatMap((part) => {
    const [from, to] = part.split("-").map(Number);
    if (from === undefined || !Number.isInteger(from)) return [];
    return Array.from({ length: (to ?? from) - from + 1 }, (_, i) => from + i);
  });
}

/** Pins this process (all its threads) when `mode` allows it; call before PostgreSQL starts. */
export function pinForAbuse(mode: "auto" | "on" | "off"): Pinning {
  const unpinned = (why: string): Pinning => ({ attackerPrefix: [], describe: `not pinned (${why}): attacker, server and PostgreSQL share all CPUs` });
  if (mode === "off") return unpinned("--pin off");
  if (!hasTaskset()) {
    if (mode === "on") throw new Error("--pin on needs taskset (util-linux)");
    return unpinned("no taskset");
  }
  const cpus = allowedCpus();
  if (cpus.length < 2 || availableParallelism() < 2) {
    if (mode === "on") throw new Error(`--pin on needs two CPUs, this process may use ${cpus.join(",")}`);
    return unpinned("fewer than two CPUs");
  }
  const [serverCpu, attackerCpu] = [cpus[0]!, cpus[cpus.length - 1]!];
  execFileSync("taskset", ["-a", "-c", "-p", String(serverCpu), String(process.pid)], { stdio: "ignore" });
  return {
    attackerPrefix: ["taskset", "-c", String(attackerCpu)],
    describe: `pinned: Keel, its authorized client and PostgreSQL on CPU ${serverCpu}; the attacker on CPU ${attackerCpu}`,
  };
}
