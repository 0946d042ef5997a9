// Keel as a peer: the loop bench's agent and read tool on a Keel built in the mode asked, runs
// submitted through SQL (the gRPC path is first-slice's), an iteration starting at each step commit.
import { performance } from "node:perf_hooks";
import pg from "pg";
import { pino } from "pino";
import { buildApp } from "../../control-plane/src/app.js";
import { loadConfig } from "../../control-plane/src/config.js";
import type { RunnerDeps } from "../../control-plane/src/runner/runner.js";
import { benchAgent, readTool, submit, waitForAll } from "../loop.js";
import { pick, type Durability } from "../support.js";
import type { Peer, PeerKind } from "./peer.js";

export function keelPeer(url: string, concurrent: number): PeerKind {
  return {
    name: "keel",
    describe: (durability) => `KEEL_DURABILITY=${durability}, ${concurrent} workers`,
    async start(durability: Durability, iterations: number): Promise<Peer> {
      const env = {
        DATABASE_URL: url,
        KEEL_LOG_LEVEL: "warn",
        KEEL_WORKERS: String(concurrent),
        ...pick(process.env, ["KEEL_DB_POOL_MAX", "KEEL_READ_FLUSH_MS"]),
        KEEL_DURABILITY: durability,
      };
      // A run's listener is called at each of its step commits: one per iteration.
      const listeners = new Map<string, () => void>();
      const app = await buildApp(loadConfig(env), env, {
        log: pino({ level: "warn" }, pino.destination(2)),
        tools: [readTool],
        wrapRunnerDeps: (deps: RunnerDeps): RunnerDeps => ({
          ...deps,
          store: {
            ...deps.store,
            commitStep: (commit) => {
              if (commit.step !== undefined) listeners.get(commit.runId)?.();
              return deps.store.commitStep(commit);
            },
          },
        }),
      });
      // A connection per loop in flight: a submission is a transaction of several statements.
      const pool = new pg.Pool({ connectionString: url, max: concurrent });
      try {
        await app.agents.put(benchAgent(iterations));
        app.startWorkers();
      } catch (error) {
        await app.stop();
        throw error;
      }
      let loops = 0;
      return {
        async runLoop(iterationStarted) {
          const db = await pool.connect();
          try {
            const runId = await submit(db, `${durability}-${loops++}-${performance.now()}`);
            listeners.set(runId, iterationStarted);
            try {
              await waitForAll(db, [runId]);
            } finally {
              listeners.delete(runId);
            }
          } finally {
            db.release();
          }
        },
        async stop() {
          await pool.end();
          await app.stop();
        },
      };
    },
  };
}
