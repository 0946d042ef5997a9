// Foreign keys take a KEY SHARE lock on the parent row for every child insert. That lock waits
// only for FOR UPDATE (and deletes, and changed keys), so the ledger locks the rows it is about to
// change FOR NO KEY UPDATE: a streamed observation or an emission never waits for a step commit,
// an admission or a cancel holding its run or conversation.
import { randomUUID } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrateLedger } from "../control-plane/src/ledger/orm.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const LEDGER = path.resolve(import.meta.dirname, "../control-plane/src/ledger");

describe("row locks and foreign keys", () => {
  it("no ledger SQL takes FOR UPDATE, which would stall every foreign-key check on the locked row", async () => {
    const offenders: string[] = [];
    for (const file of await readdir(LEDGER, { recursive: true })) {
      if (!file.endsWith(".ts") || file.endsWith(".test.ts")) continue;
      const text = await readFile(path.join(LEDGER, file), "utf8");
      text.split("\n").forEach((line, i) => {
        if (/\bFOR\s+UPDATE\b/i.test(line) && !/^\s*(\/\/|\*)/.test(line)) offenders.push(`${file}:${i + 1}: ${line.trim()}`);
      });
    }
    expect(offenders, `use FOR NO KEY UPDATE:\n${offenders.join("\n")}`).toEqual([]);
  });

  describe("against the migrated schema", () => {
    let url: string;
    const clients: pg.Client[] = [];
    const connect = async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      clients.push(client);
      return client;
    };
    beforeAll(async () => {
      url = await createTestDatabase();
      await migrateLedger({ url });
    });
    afterAll(async () => {
      await Promise.all(clients.map((client) => client.end()));
    });

    it("an observation is stored while another transaction holds its run FOR NO KEY UPDATE, and an orphan is refused", async () => {
      const db = await connect();
      const [runId, conversationId, stepId, invocationId] = [randomUUID(), randomUUID(), randomUUID(), randomUUID()];
      await db.query(
        `WITH agent AS (INSERT INTO agents (id, spec, revision) VALUES ('fk-agent', '{}', 1)),
           actor AS (INSERT INTO actors (id) VALUES ('fk-actor')),
           conversation AS (INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($2, 'fk-agent', 'fk', 'test')),
           run AS (INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage)
             VALUES ($1, 'fk-agent', $2, 'test', 'running', 'fk-actor', '{}', '{}')),
           step AS (INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at)
             VALUES ($3, $1, 0, 'replayable', 'running', 1, now()))
         INSERT INTO tool_invocations (id, run_id, step_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
         VALUES ($4, $1, $3, 'call', 0, 'exec', '1', 'read', '{}', 'pending')`,
        [runId, conversationId, stepId, invocationId],
      );

      const holder = await connect();
      await holder.query("BEGIN");
      await holder.query("SELECT id FROM runs WHERE id = $1 FOR NO KEY UPDATE", [runId]);
      const streamer = await connect();
      await streamer.query("SET lock_timeout = '2s'");
      await streamer.query(
        "INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text) VALUES ($1, $2, $3, 1, 'stdout', 'x')",
        [randomUUID(), runId, invocationId],
      );
      await holder.query("ROLLBACK");

      await expect(
        streamer.query("INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text) VALUES ($1, $2, $3, 2, 'stdout', 'x')", [
          randomUUID(),
          randomUUID(),
          invocationId,
        ]),
      ).rejects.toThrow(/observations_run_id_foreign/);
    });
  });
});
