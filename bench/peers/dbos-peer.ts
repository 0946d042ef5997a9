// DBOS Transact as a peer: a workflow whose loop makes two DBOS.runStep per iteration (the model
// turn, then the read tool), checkpointed in a system database on the bench's PostgreSQL.
import { DBOS } from "@dbos-inc/dbos-sdk";
import pg from "pg";
import type { Durability } from "../support.js";
import { withDatabase, type Peer, type PeerKind } from "./peer.js";

const DATABASE = "dbos_bench";

/** The iteration callbacks of running loops, by the id the workflow is started with. */
const listeners = new Map<string, () => void>();

async function loopWorkflow(loopId: string, iterations: number): Promise<number> {
  for (let i = 0; i < iterations; i++) {
    listeners.get(loopId)?.();
    const turn = await DBOS.runStep(() => Promise.resolve({ toolCalls: [{ name: "bench.read.v1", arguments: { key: "k" } }] }), { name: "model" });
    await DBOS.runStep(() => Promise.resolve(`value of ${turn.toolCalls[0]?.arguments.key ?? "?"}: 42`), { name: "tool" });
  }
  return iterations;
}

let registered: ((loopId: string, iterations: number) => Promise<number>) | undefined;
let pool: pg.Pool | undefined;

/**
 * DBOS is launched per mode on a pool of ours whose connections start with the mode's
 * synchronous_commit, so relaxed turns DBOS's flushes off as PostgreSQL's setting, nothing else.
 */
export function dbosPeer(url: string, concurrent: number): PeerKind {
  return {
    name: "dbos",
    describe: (durability) => `dbos-sdk 5.3.0, system database on this PostgreSQL, synchronous_commit=${durability === "strict" ? "on" : "off"}`,
    async start(durability: Durability, iterations: number): Promise<Peer> {
      await shutDownDbos();
      const admin = new pg.Client({ connectionString: url });
      await admin.connect();
      try {
        const exists = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [DATABASE]);
        if (exists.rowCount === 0) await admin.query(`CREATE DATABASE ${DATABASE}`);
      } finally {
        await admin.end();
      }
      const systemDatabaseUrl = withDatabase(url, DATABASE);
      pool = new pg.Pool({
        connectionString: systemDatabaseUrl,
        max: concurrent + 4,
        options: `-c synchronous_commit=${durability === "strict" ? "on" : "off"}`,
      });
      pool.on("error", () => {});
      registered ??= DBOS.registerWorkflow(loopWorkflow, { name: "keelPeersLoop" });
      DBOS.setConfig({ name: "keel-peers-bench", systemDatabaseUrl, systemDatabasePool: pool, logLevel: "error" });
      await DBOS.launch();
      const workflow = registered;
      let loops = 0;
      return {
        async runLoop(iterationStarted) {
          const loopId = `${durability}-${loops++}-${Date.now()}`;
          listeners.set(loopId, iterationStarted);
          try {
            const handle = await DBOS.startWorkflow(workflow, { workflowID: loopId })(loopId, iterations);
            await handle.getResult();
          } finally {
            listeners.delete(loopId);
          }
        },
        stop: shutDownDbos,
      };
    },
  };
}

/** Ends DBOS and its pool, if it was launched. */
export async function shutDownDbos(): Promise<void> {
  if (DBOS.isInitialized()) await DBOS.shutdown();
  await pool?.end();
  pool = undefined;
}
