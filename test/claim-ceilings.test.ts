// Claims no longer queue behind one exclusive lock (issue #16): far from the ceilings they start
// side by side under a shared lock and a slot, near one they take the lock exclusively. This test
// races many claimers in two pools (as two processes would) over a real PostgreSQL and checks,
// whatever the interleaving, that no agent's or the install's ceiling is ever exceeded and that no
// run starts before its conversation's earlier run has settled.
//
// The checks are sound under any scheduling: a claimer counts a run as executing from the moment
// its claim has committed until just before it asks to settle it, an interval inside the run's
// real executing time, so more of them at once in this (single-threaded) process means more in
// the database too; and a run claimed while an earlier run of its conversation has not yet been
// asked to settle was started while that earlier run was still live.
import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRunClaimRepository } from "../control-plane/src/ledger/run-claim.repository.js";
import { ADMISSION_LOCK } from "../control-plane/src/ledger/run-start.sql.js";
import { createSqlPool, type SqlPool } from "../control-plane/src/ledger/sql.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const CLAIMERS_PER_POOL = 8;
const LEASE_MS = 120_000;

interface Scenario {
  /** Agent id → its ceiling on concurrent root runs. */
  readonly agents: Readonly<Record<string, number>>;
  readonly installCeiling: number;
  readonly conversations: number;
  readonly runsPerConversation: number;
}

interface QueuedRun {
  readonly id: string;
  readonly agentId: string;
  readonly conversation: number;
  readonly index: number;
}

interface Outcome {
  readonly maxActive: number;
  readonly maxActiveByAgent: Readonly<Record<string, number>>;
  readonly violations: readonly string[];
  readonly claimed: number;
}

describe("claims under the start locks", () => {
  let keel: TestKeel;
  let db: pg.Pool;
  const pools: SqlPool[] = [];

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 0, agents: [] });
    db = new pg.Pool({ connectionString: keel.databaseUrl, max: 4 });
    for (let i = 0; i < 2; i++) pools.push(createSqlPool({ url: keel.databaseUrl, max: CLAIMERS_PER_POOL }));
  });

  afterAll(async () => {
    for (const pool of pools) await pool.close();
    await db?.end();
    await keel?.stop();
  });

  /** Queued root runs, oldest first within each conversation; conversations alternate between agents. */
  async function queue(scenario: Scenario): Promise<QueuedRun[]> {
    const agentIds = Object.keys(scenario.agents);
    for (const [id, ceiling] of Object.entries(scenario.agents)) {
      await keel.app.agents.put({ ...DEMO_AGENT, id, maxConcurrentRootRuns: ceiling });
    }
    await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
    const runs: QueuedRun[] = [];
    const base = Date.now() - 60_000;
    for (let c = 0; c < scenario.conversations; c++) {
      const agentId = agentIds[c % agentIds.length]!;
      const conversationId = randomUUID();
      await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [conversationId, agentId, conversationId]);
      for (let index = 0; index < scenario.runsPerConversation; index++) {
        const id = randomUUID();
        // Interleaved across conversations, so the oldest claimable run is often behind its conversation.
        const createdAt = new Date(base + index * 1000 + c);
        await db.query(
          `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage,
             request_received_at, created_at)
           VALUES ($1, $2, $3, 'test', 'queued', 'someone', '{}', '{}', $4, $4)`,
          [id, agentId, conversationId, createdAt],
        );
        runs.push({ id, agentId, conversation: c, index });
      }
    }
    return runs;
  }

  async function race(scenario: Scenario): Promise<Outcome> {
    // The install's ceiling is the ledger's, as every replica reads it.
    await db.query("UPDATE install_settings SET root_run_ceiling = $1, updated_by = 'claim-ceilings test' WHERE id = 1", [scenario.installCeiling]);
    const runs = await queue(scenario);
    const byId = new Map(runs.map((run) => [run.id, run]));
    const settleAsked = new Set<string>();
    const activeByAgent = new Map<string, number>();
    const maxActiveByAgent: Record<string, number> = {};
    let active = 0;
    let maxActive = 0;
    let claimed = 0;
    const violations: string[] = [];

    const claimer = async (pool: SqlPool, workerId: string): Promise<void> => {
      const claims = createRunClaimRepository(pool);
      let idle = 0;
      while (settleAsked.size < runs.length) {
        const run = await claims.claimNext(workerId, LEASE_MS);
        const mine = run === undefined ? undefined : byId.get(run.runId);
        if (mine === undefined) {
          // Nothing this claimer may start now: back off briefly and look again.
          await new Promise((resolve) => setTimeout(resolve, Math.min(20, ++idle)));
          continue;
        }
        idle = 0;
        claimed++;
        for (const earlier of runs) {
          if (earlier.conversation === mine.conversation && earlier.index < mine.index && !settleAsked.has(earlier.id)) {
            violations.push(`run ${mine.index} of conversation ${mine.conversation} started before run ${earlier.index} settled`);
          }
        }
        active++;
        const agentActive = (activeByAgent.get(mine.agentId) ?? 0) + 1;
        activeByAgent.set(mine.agentId, agentActive);
        maxActive = Math.max(maxActive, active);
        maxActiveByAgent[mine.agentId] = Math.max(maxActiveByAgent[mine.agentId] ?? 0, agentActive);
        if (active > scenario.installCeiling) violations.push(`${active} root runs executing, install ceiling ${scenario.installCeiling}`);
        if (agentActive > scenario.agents[mine.agentId]!) violations.push(`${agentActive} runs of ${mine.agentId} executing, its ceiling ${scenario.agents[mine.agentId]}`);
        // Hold the run a little, as a turn would, so claims overlap.
        await new Promise((resolve) => setTimeout(resolve, 5 + Math.floor(Math.random() * 25)));
        active--;
        activeByAgent.set(mine.agentId, (activeByAgent.get(mine.agentId) ?? 1) - 1);
        settleAsked.add(mine.id);
        await db.query("UPDATE runs SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL WHERE id = $1", [mine.id]);
      }
    };

    await Promise.all(pools.flatMap((pool, p) => Array.from({ length: CLAIMERS_PER_POOL }, (_, w) => claimer(pool, `pool${p}-worker${w}`))));
    const { rows } = await db.query<{ n: string }>("SELECT count(*) AS n FROM runs WHERE id = ANY($1::uuid[]) AND status = 'succeeded'", [runs.map((run) => run.id)]);
    expect(Number(rows[0]?.n)).toBe(runs.length);
    return { maxActive, maxActiveByAgent, violations, claimed };
  }

  it("near the ceilings: the exclusive lock keeps every start within them, in conversation order", { timeout: 120_000 }, async () => {
    const outcome = await race({ agents: { "near-a": 3, "near-b": 2 }, installCeiling: 4, conversations: 10, runsPerConversation: 3 });
    expect(outcome.violations).toEqual([]);
    expect(outcome.claimed).toBe(30);
    expect(outcome.maxActive).toBeLessThanOrEqual(4);
  });

  it("far from the ceilings and up to them: slot starts side by side never add up past a ceiling", { timeout: 120_000 }, async () => {
    // With 8 slots, starts take the shared lock while an agent has at most 2 (10 - 8) runs executing
    // and the install at most 6 (14 - 8), and the exclusive one beyond: 16 claimers cross both.
    const outcome = await race({ agents: { "far-a": 10, "far-b": 10 }, installCeiling: 14, conversations: 24, runsPerConversation: 3 });
    expect(outcome.violations).toEqual([]);
    expect(outcome.claimed).toBe(72);
    expect(outcome.maxActive).toBeLessThanOrEqual(14);
  });
  it("a claim held back only by another start's margin looks again and starts the run: room is not left empty", { timeout: 60_000 }, async () => {
    // Ceiling 16, 8 running: a claim counts 8, takes a slot (8 + 8 slots fit) and waits for the
    // admission lock, which another start holds while it starts a 9th. After that commit the
    // claim counts 9 and, counting the other 7 slots as taken, 16: no room. There is room.
    await db.query("UPDATE install_settings SET root_run_ceiling = 64, updated_by = 'claim-ceilings test' WHERE id = 1");
    const agentId = "margin-a";
    await keel.app.agents.put({ ...DEMO_AGENT, id: agentId, maxConcurrentRootRuns: 16 });
    await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
    const insertRun = async (status: "running" | "queued"): Promise<string> => {
      const conversationId = randomUUID();
      const id = randomUUID();
      await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [conversationId, agentId, conversationId]);
      // Due a minute ago: not_before defaults to the database's now(), which the claim compares
      // with this process's clock in whole milliseconds, so a run claimed within a millisecond of
      // its insert could still look to be coalescing and not be a candidate at all.
      await db.query(
        `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_expires_at, not_before)
         VALUES ($1, $2, $3, 'test', $4, 'someone', '{}', '{}', $5, $6, now() - interval '1 minute')`,
        [id, agentId, conversationId, status, status === "running" ? "elsewhere" : null, status === "running" ? new Date(Date.now() + LEASE_MS) : null],
      );
      return id;
    };
    for (let i = 0; i < 8; i++) await insertRun("running");
    const queued = await insertRun("queued");
    const ninth = await insertRun("queued");

    const other = await db.connect();
    try {
      await other.query("BEGIN");
      await other.query("SELECT pg_advisory_xact_lock($1)", [ADMISSION_LOCK]);
      await other.query("UPDATE runs SET status = 'running', lease_owner = 'elsewhere', lease_expires_at = now() + interval '2 minutes' WHERE id = $1", [ninth]);
      const claims = createRunClaimRepository(pools[0]!);
      let settled: string | undefined;
      const claiming = claims.claimNext("margin-worker", LEASE_MS).then(
        (claim) => ((settled = `returned ${claim === undefined ? "no run" : `run ${claim.runId}`}`), claim),
        (error: unknown) => ((settled = `failed: ${String(error)}`), undefined),
      );
      // The claim is waiting for the admission lock: only then does the other start commit. The
      // cluster is shared by the test files, so only this database's advisory waits count.
      const deadline = Date.now() + 30_000;
      for (;;) {
        const { rows } = await db.query<{ n: string }>(
          `SELECT count(*) AS n FROM pg_locks l JOIN pg_database d ON d.oid = l.database
           WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted`,
        );
        if (Number(rows[0]?.n) > 0) break;
        if (settled !== undefined || Date.now() > deadline) {
          const { rows: waits } = await db.query<{ state: string; wait: string | null; query: string }>(
            `SELECT state, wait_event_type || ':' || wait_event AS wait, left(query, 120) AS query FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`,
          );
          throw new Error(`the claim never waited for the admission lock (${settled ?? "still pending"}); busy sessions: ${JSON.stringify(waits)}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      await other.query("COMMIT");
      const claimed = await claiming;
      expect(claimed?.runId).toBe(queued);
    } finally {
      other.release();
    }
    const { rows } = await db.query<{ n: string }>("SELECT count(*) AS n FROM runs WHERE agent_id = $1 AND status = 'running'", [agentId]);
    expect(Number(rows[0]?.n)).toBe(10);
  });
});
