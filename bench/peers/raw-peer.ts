// The floor: a raw PostgreSQL transaction of two rows per iteration (the model turn's record and
// the tool's), committed as the mode says: synchronously for strict, synchronous_commit off for relaxed.
import { randomUUID } from "node:crypto";
import pg from "pg";
import { beginRaw, type Durability } from "../support.js";
import type { Peer, PeerKind } from "./peer.js";

const TABLE = `CREATE TABLE IF NOT EXISTS bench_peer_steps (
  id uuid PRIMARY KEY, loop_id uuid NOT NULL, iteration int NOT NULL, kind text NOT NULL, output jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`;

export function rawPeer(url: string, concurrent: number): PeerKind {
  return {
    name: "raw 2-row txn",
    describe: (durability) => (durability === "strict" ? "synchronous commit" : "SET LOCAL synchronous_commit = off"),
    async start(durability: Durability, iterations: number): Promise<Peer> {
      const pool = new pg.Pool({ connectionString: url, max: concurrent });
      await pool.query(TABLE);
      return {
        async runLoop(iterationStarted) {
          const db = await pool.connect();
          const loopId = randomUUID();
          try {
            for (let i = 0; i < iterations; i++) {
              iterationStarted();
              await beginRaw(db, durability);
              await db.query(
                `INSERT INTO bench_peer_steps (id, loop_id, iteration, kind, output) VALUES
                   ($1, $3, $4, 'model', '{"toolCalls":[{"name":"bench.read.v1","arguments":{"key":"k"}}]}'::jsonb),
                   ($2, $3, $4, 'tool', '"value of k: 42"'::jsonb)`,
                [randomUUID(), randomUUID(), loopId, i],
              );
              await db.query("COMMIT");
            }
          } finally {
            db.release();
          }
        },
        stop: () => pool.end(),
      };
    },
  };
}
