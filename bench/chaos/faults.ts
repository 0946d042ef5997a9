// Faults at random intervals, one at a time, each finished (the process back, the database
// accepting connections) before the next is drawn. Kinds come in shuffled rounds so every kind
// is exercised about equally often, from a seeded generator so a run can be repeated.
import { setTimeout as delay } from "node:timers/promises";
import type { ChaosPostgres } from "./postgres.js";
import type { ChaosTopology } from "./topology.js";

export const FAULT_KINDS = ["kill_replica", "stop_replica", "kill_agent", "restart_postgres"] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface FaultRecord {
  readonly kind: FaultKind;
  readonly target: string;
  readonly at: number;
  /** From the fault to the target serving again. */
  readonly recoveryMs: number;
  readonly error?: string;
}

export interface FaultOptions {
  readonly topology: ChaosTopology;
  readonly postgres: ChaosPostgres;
  readonly rng: () => number;
  readonly minGapMs: number;
  readonly maxGapMs: number;
  /** A stopped replica stays stopped this long: past its lease, so another replica takes its runs. */
  readonly stopMs: number;
  readonly log: (line: string) => void;
}

export interface FaultInjector {
  readonly records: readonly FaultRecord[];
  /** Replicas and agents that exited though no fault killed them (each restarted), with their last lines. */
  readonly unexpectedExits: readonly string[];
  /** Stops drawing faults and waits for the one under way. */
  stop(): Promise<void>;
}

/** mulberry32: small, fast and good enough to draw fault times from a printed seed. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Resolves after `ms`, or at once when `signal` aborts. */
const sleep = (ms: number, signal?: AbortSignal) => delay(ms, undefined, signal === undefined ? {} : { signal }).catch(() => undefined);

export function startFaults(options: FaultOptions): FaultInjector {
  const { topology, postgres, rng } = options;
  const records: FaultRecord[] = [];
  const unexpectedExits: string[] = [];
  const stopping = new AbortController();
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rng() * items.length)]!;
  let round: FaultKind[] = [];

  const inject = async (kind: FaultKind): Promise<string> => {
    switch (kind) {
      case "kill_replica": {
        const replica = pick(topology.replicas);
        await topology.restartReplica(replica); // SIGKILL, then start again on the same port
        return `replica-${replica.index}`;
      }
      case "stop_replica": {
        const replica = pick(topology.replicas);
        const child = replica.process?.process;
        if (child === undefined) return `replica-${replica.index} (not running)`;
        replica.stopped = true;
        child.kill("SIGSTOP");
        await sleep(options.stopMs);
        child.kill("SIGCONT");
        replica.stopped = false;
        return `replica-${replica.index}`;
      }
      case "kill_agent": {
        const agent = pick(topology.agents);
        await topology.restartAgent(agent);
        return agent.hostId;
      }
      case "restart_postgres":
        await postgres.restartImmediately();
        return "postgres";
    }
  };

  const loop = async () => {
    while (!stopping.signal.aborted) {
      await sleep(options.minGapMs + rng() * (options.maxGapMs - options.minGapMs), stopping.signal);
      if (stopping.signal.aborted) return;
      for (const exit of await topology.heal()) {
        unexpectedExits.push(exit);
        options.log(`unexpected exit: ${exit}`);
      }
      if (round.length === 0) round = [...FAULT_KINDS].sort(() => rng() - 0.5);
      const kind = round.shift()!;
      const at = Date.now();
      try {
        const target = await inject(kind);
        records.push({ kind, target, at, recoveryMs: Date.now() - at });
        options.log(`fault ${kind} ${target}: back after ${Date.now() - at} ms`);
      } catch (error) {
        const message = error instanceof Error ? error.message.split("\n")[0]! : String(error);
        records.push({ kind, target: "?", at, recoveryMs: Date.now() - at, error: message });
        options.log(`fault ${kind} failed to recover: ${message}`);
      }
    }
  };
  const running = loop();

  return {
    records,
    unexpectedExits,
    async stop() {
      stopping.abort();
      await running;
    },
  };
}
