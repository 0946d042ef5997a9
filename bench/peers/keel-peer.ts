// Keel as a peer: the loop bench's agent and read tool on a Keel built in the mode asked, runs
// submitted through SQL (the gRPC path is first-slice's), an iteration starting at each step
// commit, a loop ending when its run's settling commit returns (no polling).
import { randomUUID } from "node:crypto";
import pg from "pg";
import { pino } from "pino";
import { buildApp } from "../../control-plane/src/app.js";
import { loadConfig } from "../../control-plane/src/config.js";
import { isTerminal, type RunStatus } from "../../control-plane/src/domain/run.js";
import type { RunnerDeps } from "../../control-plane/src/runner/runner.js";
import { benchAgent, readTool, submit } from "../loop.js";
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
      // A run's listener hears each of its step commits (one per iteration) and its settling one.
      const listeners = new Map<string, { readonly step: () => void; readonly settled: (status: RunStatus) => void }>();
      const app = await buildApp(loadConfig(env), env, {
        log: pino({ level: "warn" }, pino.destination(2)),
        tools: [readTool],
        wrapRunnerDeps: (deps: RunnerDeps): RunnerDeps => ({
          ...deps,
          store: {
            ...deps.store,
            commitStep: async (commit) => {
              const listener = listeners.get(commit.runId);
              if (commit.step !== undefined) listener?.step();
              const control = await deps.store.commitStep(commit);
              if (isTerminal(commit.status)) listener?.settled(commit.status);
              return control;
            },
          },
        }),
      });
      // A connection per loop in flight: a submission is a transaction of several statements.
      const pool = new pg.Pool({ connectionString: url, max: concurrent });
      try {
        await app.agents.put(benchAgent(iterations));
        // The submitting connections are opened now, not inside the timed phase: the peers' clients
        // (DBOS's pool, Restate's HTTP client) are warm too.
        const clients = await Promise.all(Array.from({ length: concurrent }, () => pool.connect()));
        for (const client of clients) client.release();
        app.startWorkers();
      } catch (error) {
        await app.stop();
        throw error;
      }
      let loops = 0;
      return {
        async runLoop(iterationStarted) {
          const runId = randomUUID();
          const settled = new Promise<RunStatus>((resolve) => listeners.set(runId, { step: iterationStarted, settled: resolve }));
          try {
            const db = await pool.connect();
            try {
              await submit(db, `${durability}-${loops++}-${runId}`, "queued", runId);
            } finally {
              db.release();
            }
            const status = await settled;
            if (status !== "succeeded") throw new Error(`keel run ${runId} ended ${status}`);
          } finally {
            listeners.delete(runId);
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
