// Hot-path SQL stays hand-written, so nothing but PostgreSQL checks it against the schema: every
// statement() of the ledger is prepared here against a freshly migrated database, and a renamed
// column or table fails CI naming the statement, not at run time on the path that uses it.
import { readdir } from "node:fs/promises";
import path from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrateLedger } from "../control-plane/src/ledger/orm.js";
import { FOLLOW_UP_PROGRESS_RECORDS } from "../control-plane/src/domain/transcript-builder.js";
import { GENERIC_PLAN_OPTIONS, registeredStatements } from "../control-plane/src/ledger/sql.js";
import { fencedCommitParams } from "../control-plane/src/ledger/step-commit-params.js";
import { fencedCommit, fencedHeldCommit, fencedQuietCommit } from "../control-plane/src/ledger/step-commit.sql.js";
import { EXECUTING_STATUSES, ZERO_USAGE } from "../control-plane/src/domain/run.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const LEDGER = path.resolve(import.meta.dirname, "../control-plane/src/ledger");

let db: pg.Client;
beforeAll(async () => {
  // Importing a module defines (and registers) its statements.
  for (const file of await readdir(LEDGER, { recursive: true })) {
    if (file.endsWith(".ts") && !file.endsWith(".test.ts") && !file.startsWith("migrations")) await import(pathToFileURL(path.join(LEDGER, file)).href);
  }
  const url = await createTestDatabase();
  await migrateLedger({ url });
  db = new pg.Client({ connectionString: url });
  await db.connect();
});
afterAll(async () => {
  await db?.end();
});

/** A fenced commit by worker-1 at epoch 1 that settles one read call of the run. */
const settleParams = (runId: string, invocationId: string) =>
  fencedCommitParams(
    { runId, workerId: "worker-1", epoch: 1 },
    { status: "running", usage: ZERO_USAGE, emissions: [], summary: "settled" },
    {
      step: undefined,
      outcomes: [{ invocationId, effect: "read", outcome: "succeeded", resultText: "value", artifacts: [] }],
      crossesCommitBoundary: false,
      writes: false,
      events: [],
      unlessChangedSince: undefined,
    },
    "strict",
  );
const literal = (value: unknown): string => {
  if (value === null) return "NULL";
  if (value instanceof Date) return db.escapeLiteral(value.toISOString());
  if (Array.isArray(value)) return db.escapeLiteral(`{${value.join(",")}}`);
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") return db.escapeLiteral(String(value));
  throw new Error(`no literal for ${typeof value}`);
};

/** The rows an executed plan's scans of `table` read, kept or filtered out (not the rows it wrote). */
const rowsRead = (node: Record<string, unknown>, table: string): number => {
  const own =
    node["Relation Name"] === table && node["Node Type"] !== "ModifyTable"
      ? (Number(node["Actual Rows"] ?? 0) + Number(node["Rows Removed by Filter"] ?? 0) + Number(node["Rows Removed by Index Recheck"] ?? 0)) *
        Number(node["Actual Loops"] ?? 1)
      : 0;
  return own + ((node["Plans"] as Record<string, unknown>[] | undefined) ?? []).reduce((sum, child) => sum + rowsRead(child, table), 0);
};

describe("the ledger's statements against the migrated schema", () => {
  it("every registered statement prepares", async () => {
    const statements = registeredStatements();
    expect(statements.length).toBeGreaterThan(0);
    const failures: string[] = [];
    for (const statement of statements) {
      try {
        await db.query(`PREPARE ${statement.name} AS ${statement.text}`);
        await db.query(`DEALLOCATE ${statement.name}`);
      } catch (error) {
        failures.push(`${statement.name}: ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    expect(failures, `statements that do not prepare:\n${failures.join("\n")}`).toEqual([]);
  });
});

describe("generic plans made while the ledger is empty", () => {
  // A connection plans each statement once and keeps the plan until the table is analyzed, which
  // autovacuum does a minute or more later: a plan made on a new install's empty tables must still
  // find rows by key once they hold thousands.
  // Every shape of the fenced commit: the settled calls are found the same way in each.
  for (const commit of [fencedCommit, fencedHeldCommit, fencedQuietCommit]) {
    it(`${commit.name} settles a call by its key after the run's calls grew from one to thousands`, async () => {
      const url = await createTestDatabase();
      await migrateLedger({ url });
      // Opened as the step-commit pool opens its connections: generic plans, no sequential scans.
      const fresh = new pg.Client({ connectionString: url, options: GENERIC_PLAN_OPTIONS });
      await fresh.connect();
      try {
        await fresh.query(`INSERT INTO agents (id, spec, revision) VALUES ('agent-1', '{}'::jsonb, 1);
          INSERT INTO actors (id) VALUES ('actor-1');
          INSERT INTO conversations (id, agent_id, external_id, connector) VALUES (md5('c1')::uuid, 'agent-1', 'conversation-1', 'bench');
          INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_epoch)
            VALUES (md5('fresh-run')::uuid, 'agent-1', md5('c1')::uuid, 'bench', 'running', 'actor-1', '{}'::jsonb, '{}'::jsonb, 'worker-1', 1);`);
        const calls = (from: number, to: number) => `INSERT INTO tool_invocations (id, run_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
          SELECT md5('fresh-t' || i)::uuid, md5('fresh-run')::uuid, 'call-' || i, 0, 'bench.read.v1', '1', 'read', '{}'::jsonb, 'pending'
          FROM generate_series(${from}, ${to}) i`;
        const ids = (await fresh.query<{ run: string; first: string; last: string }>(
          "SELECT md5('fresh-run')::uuid::text AS run, md5('fresh-t0')::uuid::text AS first, md5('fresh-t3000')::uuid::text AS last",
        )).rows[0]!;
        await fresh.query(calls(0, 0));
        const { rows: mode } = await fresh.query<{ plan_cache_mode: string }>("SHOW plan_cache_mode");
        expect(mode[0]?.plan_cache_mode).toBe("force_generic_plan");
        await fresh.query("BEGIN");
        await fresh.query(`PREPARE settle_fresh AS ${commit.text}`);
        const execute = (invocationId: string) => `EXECUTE settle_fresh(${commit.bind(settleParams(ids.run, invocationId)).map(literal).join(", ")})`;
        // Planned now, with one call in the table; the plan is kept for the next execution.
        await fresh.query(execute(ids.first));
        await fresh.query(calls(1, 3000));
        const { rows } = await fresh.query<{ "QUERY PLAN": { Plan: Record<string, unknown> }[] }>(`EXPLAIN (ANALYZE, FORMAT JSON) ${execute(ids.last)}`);
        expect(rowsRead(rows[0]!["QUERY PLAN"][0]!.Plan, "tool_invocations")).toBe(1);
        const { rows: settled } = await fresh.query<{ status: string }>("SELECT status FROM tool_invocations WHERE id = $1", [ids.last]);
        expect(settled[0]?.status).toBe("succeeded");
        await fresh.query("ROLLBACK");
      } finally {
        await fresh.end();
      }
    });
  }
});

// Admission (ledger/conversation.repository.ts), the claim (run-claim.repository.ts) and the fenced
// step commit (step-commit.repository.ts) run with plan_cache_mode force_generic_plan: each statement is
// planned once per connection without its parameters' values. A generic plan that
// scans a table which grows with traffic would make every message slower as the ledger fills, so
// this fills the tables, gathers statistics and reads each generic plan.
const ADMISSION_STATEMENT = /^keel_(admission_|follow_up_|run_append_events$|run_stop_parked$|run_work_done$|emission_reserve$|step_commit_fenced$|step_commit_held$|step_commit_quiet$|step_commit_fenced_batch$|step_commit_held_batch$|claim_candidate$|claim_run$)/;
const GROWING_TABLES = ["actors", "conversations", "messages", "runs", "run_triggers", "run_events", "emissions", "progress_events", "tool_invocations", "work_graphs", "observations"];

describe("admission's statements with generic plans", () => {
  beforeAll(async () => {
    const rows = 20_000;
    await db.query(`INSERT INTO agents (id, spec, revision) SELECT 'agent-' || a, '{}'::jsonb, 1 FROM generate_series(1, 20) a`);
    await db.query(`INSERT INTO actors (id) SELECT 'actor-' || i FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO conversations (id, agent_id, external_id, connector)
      SELECT md5('c' || i)::uuid, 'agent-' || (i % 20 + 1), 'conversation-' || i, 'bench' FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO messages (id, conversation_id, external_id, actor_id, text)
      SELECT md5('m' || i)::uuid, md5('c' || (i % ${rows / 4} + 1))::uuid, 'message-' || i, 'actor-' || i, 'text' FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage)
      SELECT md5('r' || i)::uuid, 'agent-' || ((i % ${rows / 4}) % 20 + 1), md5('c' || (i % ${rows / 4} + 1))::uuid, 'bench',
        CASE WHEN i % 100 = 0 THEN 'running' ELSE 'succeeded' END, 'actor-' || i, '{}'::jsonb, '{}'::jsonb FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id)
      SELECT md5('r' || i)::uuid, md5('m' || i)::uuid, 'actor-' || i, 'message-' || i FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO run_events (run_id, seq, kind) SELECT md5('r' || i)::uuid, s, 'created' FROM generate_series(1, ${rows}) i, generate_series(1, 3) s`);
    await db.query(`INSERT INTO progress_events (id, run_id, conversation_id, subject, seq, text)
      SELECT md5('p' || i)::uuid, md5('r' || i)::uuid, md5('c' || (i % ${rows / 4} + 1))::uuid, 'subject-' || i, 1, 'progress' FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO emissions (id, idempotency_key, connector, kind, agent_id, conversation_id, external_conversation_id, addressed_actor_ids)
      SELECT md5('e' || i)::uuid, 'key-' || i, 'bench', 'reply', 'agent-1', md5('c' || (i % ${rows / 4} + 1))::uuid, 'conversation-' || i, '[]'::jsonb
      FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO tool_invocations (id, run_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
      SELECT md5('t' || i)::uuid, md5('r' || i)::uuid, 'call-' || i, 0, 'keel.ask_user.v1', '1', 'read', '{}'::jsonb, 'succeeded' FROM generate_series(1, ${rows}) i`);
    await db.query(`INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text)
      SELECT md5('o' || i || '-' || s)::uuid, md5('r' || i)::uuid, md5('t' || i)::uuid, s, 'stdout', 'line' FROM generate_series(1, ${rows}) i, generate_series(1, 3) s`);
    await db.query(`INSERT INTO work_graphs (id, root_run_id, aggregate_usage) SELECT md5('g' || i)::uuid, md5('r' || i)::uuid, '{}'::jsonb FROM generate_series(1, ${rows}, 10) i`);
    await db.query("ANALYZE");
  });

  /** Each growing table the generic plan reads whole. */
  const scans = async (text: string): Promise<string[]> => {
    const { rows } = await db.query<{ "QUERY PLAN": unknown }>(`EXPLAIN (GENERIC_PLAN, FORMAT JSON) ${text}`);
    const found: string[] = [];
    const walk = (node: Record<string, unknown>) => {
      if (node["Node Type"] === "Seq Scan" && GROWING_TABLES.includes(String(node["Relation Name"]))) found.push(String(node["Relation Name"]));
      for (const child of (node["Plans"] as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    for (const plan of rows[0]!["QUERY PLAN"] as { Plan: Record<string, unknown> }[]) walk(plan.Plan);
    return found;
  };

  // call_observations adds each settled call's result from tool_invocations; a join condition does
  // not reach into that branch, so its readers also name their calls as an array.
  it("read a call's observations, its result included, by key and never every call", async () => {
    const readers = registeredStatements().filter((s) => /^keel_run_query_(observations|budgeted_observations|step_bytes)$/.test(s.name));
    expect(readers.map((s) => s.name).sort()).toEqual(["keel_run_query_budgeted_observations", "keel_run_query_observations", "keel_run_query_step_bytes"]);
    for (const { name, text } of readers) {
      expect(text, name).toMatch(/call_observations/);
      expect(await scans(text), name).toEqual([]);
    }
  });

  it("scan no table that grows with traffic", async () => {
    const admission = registeredStatements().filter((s) => ADMISSION_STATEMENT.test(s.name) || s.plans === "generic");
    expect(admission.map((s) => s.name)).toEqual(
      expect.arrayContaining([
        "keel_admission_store_message",
        "keel_admission_conversation_runs",
        "keel_admission_insert_run",
        "keel_step_commit_fenced",
        "keel_step_commit_held",
        "keel_step_commit_held_batch",
        "keel_claim_candidate",
        "keel_claim_run",
        // Once per run, outside a transaction: declared generic.
        "keel_claim_next_due",
        "keel_progress_load",
        "keel_model_call_reserve_acks",
        "keel_history_recent_progress_of_conversation",
      ]),
    );
    const failures: string[] = [];
    for (const { name, text } of admission) {
      const tables = await scans(text);
      if (tables.length > 0) failures.push(`${name}: seq scan of ${tables.join(", ")}`);
    }
    expect(failures, `generic plans that scan a growing table:\n${failures.join("\n")}`).toEqual([]);
  });

  // Through the status index the count read every run that had executed since the last vacuum;
  // planned per call, to match the statuses it was given to an index, it cost more than it read.
  it("count executing root runs on a generic plan through their own index, both naming exactly the executing statuses", async () => {
    const statusesIn = (text: string) => [...text.matchAll(/'([a-z_]+)'/g)].map((match) => match[1]).sort();
    const { rows: index } = await db.query<{ predicate: string }>(
      "SELECT pg_get_expr(i.indpred, i.indrelid) AS predicate FROM pg_index i WHERE i.indexrelid = 'runs_executing_root_index'::regclass",
    );
    expect(index[0]!.predicate).toMatch(/parent_run_id IS NULL/);
    expect(statusesIn(index[0]!.predicate)).toEqual([...EXECUTING_STATUSES].sort());
    const { rows: fn } = await db.query<{ source: string; proconfig: string[] | null }>(
      "SELECT prosrc AS source, proconfig FROM pg_proc WHERE proname = 'keel_locked_root_run_counts'",
    );
    expect(fn).toHaveLength(1);
    expect(fn[0]!.proconfig).toBeNull();
    const count = /select count\(\*\)[^;]*?from runs where ([^;]*);/.exec(fn[0]!.source);
    expect(count, fn[0]!.source).not.toBeNull();
    expect(statusesIn(count![1]!)).toEqual([...EXECUTING_STATUSES].sort());
    const plan = async (text: string) => (await db.query<{ "QUERY PLAN": string }>(`EXPLAIN (GENERIC_PLAN) ${text}`)).rows.map((row) => row["QUERY PLAN"]).join("\n");
    expect(await plan(`select count(*) filter (where agent_id = $1), count(*) from runs where ${count![1]!}`)).toMatch(/runs_executing_root_index/);
    expect(await plan(registeredStatements().find((s) => s.name === "keel_claim_candidate")!.text)).toMatch(/runs_executing_root_index/);
  });

  it("keel_admission_conversation_runs reads a long conversation's live runs, its latest and its latest notices, not every run it had", async () => {
    const conversation = "conversation-long";
    await db.query(`INSERT INTO conversations (id, agent_id, external_id, connector) VALUES (md5('long')::uuid, 'agent-1', '${conversation}', 'bench')`);
    await db.query(`INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, created_at)
      SELECT md5('long-r' || i)::uuid, 'agent-1', md5('long')::uuid, 'bench', CASE WHEN i = 3000 THEN 'running' ELSE 'succeeded' END, 'actor-1',
        '{}'::jsonb, '{}'::jsonb, now() - make_interval(secs => 3001 - i) FROM generate_series(1, 3000) i`);
    await db.query(`INSERT INTO progress_events (id, run_id, conversation_id, subject, seq, text, created_at)
      SELECT md5('long-p' || i)::uuid, md5('long-r' || i)::uuid, md5('long')::uuid, 'long-subject-' || i, 1, 'progress', now() - make_interval(secs => 3001 - i)
      FROM generate_series(1, 3000) i`);
    await db.query("ANALYZE runs, progress_events");
    const statement = registeredStatements().find((s) => s.name === "keel_admission_conversation_runs")!;
    const params = statement.bind({ agentId: "agent-1", externalId: conversation } as never);
    await db.query("BEGIN");
    try {
      await db.query("SET LOCAL plan_cache_mode = force_generic_plan");
      await db.query(`PREPARE long_conversation AS ${statement.text}`);
      const { rows } = await db.query<{ "QUERY PLAN": { Plan: Record<string, unknown> }[] }>(
        `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE long_conversation(${params.map((value) => db.escapeLiteral(String(value))).join(", ")})`,
      );
      const plan = rows[0]!["QUERY PLAN"][0]!.Plan;
      const read = { runs: rowsRead(plan, "runs"), progress_events: rowsRead(plan, "progress_events") };
      // The running run (also the latest), found by two index lookups and fetched by its key; the
      // newest notices from the end of the conversation's index.
      expect(rows[0]!["QUERY PLAN"][0]!.Plan["Actual Rows"]).toBe(1);
      expect(read.runs).toBeGreaterThan(0);
      expect(read.runs).toBeLessThan(20);
      expect(read.progress_events).toBeGreaterThan(0);
      expect(read.progress_events).toBeLessThanOrEqual(FOLLOW_UP_PROGRESS_RECORDS);
    } finally {
      await db.query("ROLLBACK");
    }
  });

  for (const commit of [fencedCommit, fencedHeldCommit]) {
    it(`${commit.name} settles a call with a HOT update: no index entry is written`, async () => {
      await db.query(`INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_epoch)
        VALUES (md5('hot-run-${commit.name}')::uuid, 'agent-1', md5('c1')::uuid, 'bench', 'running', 'actor-1', '{}'::jsonb, '{}'::jsonb, 'worker-1', 1)`);
      await db.query(`INSERT INTO tool_invocations (id, run_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
        VALUES (md5('hot-t-${commit.name}')::uuid, md5('hot-run-${commit.name}')::uuid, 'call-hot', 0, 'bench.read.v1', '1', 'read', '{}'::jsonb, 'pending')`);
      const [{ run, call }] = (await db.query<{ run: string; call: string }>(`SELECT md5('hot-run-${commit.name}')::uuid::text AS run, md5('hot-t-${commit.name}')::uuid::text AS call`)).rows as [
        { run: string; call: string },
      ];
      // This backend's table counters reach the shared statistics once it is idle after a forced flush.
      const updates = async (): Promise<{ all: number; hot: number }> => {
        await db.query("SELECT pg_stat_force_next_flush()");
        const { rows } = await db.query<{ n_tup_upd: string; n_tup_hot_upd: string }>(
          "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tool_invocations'",
        );
        return { all: Number(rows[0]?.n_tup_upd), hot: Number(rows[0]?.n_tup_hot_upd) };
      };
      const before = await updates();
      const { rows: fenced } = await db.query<{ id: string }>({ text: commit.text, values: commit.bind(settleParams(run, call)) });
      expect(fenced.map((row) => row.id)).toEqual([run]);
      const after = await updates();
      expect(after.all - before.all).toBe(1);
      expect(after.hot - before.hot).toBe(1);
    });

    it(`${commit.name} settles a long run's call by its key, not by reading every call the run made`, async () => {
      await db.query(`INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, lease_owner, lease_epoch)
        VALUES (md5('long-run-${commit.name}')::uuid, 'agent-1', md5('c1')::uuid, 'bench', 'running', 'actor-1', '{}'::jsonb, '{}'::jsonb, 'worker-1', 1)`);
      await db.query(`INSERT INTO tool_invocations (id, run_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
        SELECT md5('long-t${commit.name}' || i)::uuid, md5('long-run-${commit.name}')::uuid, 'call-' || i, 0, 'bench.read.v1', '1', 'read', '{}'::jsonb,
          CASE WHEN i = 3000 THEN 'pending' ELSE 'succeeded' END FROM generate_series(1, 3000) i`);
      await db.query("ANALYZE runs, tool_invocations");
      const [{ id: runId }] = (await db.query<{ id: string }>(`SELECT md5('long-run-${commit.name}')::uuid::text AS id`)).rows as [{ id: string }];
      const [{ id: invocationId }] = (await db.query<{ id: string }>(`SELECT md5('long-t${commit.name}3000')::uuid::text AS id`)).rows as [{ id: string }];
      const params = settleParams(runId, invocationId);
      await db.query("BEGIN");
      try {
        await db.query("SET LOCAL plan_cache_mode = force_generic_plan");
        await db.query(`PREPARE settle_long_run_${commit.name} AS ${commit.text}`);
        const { rows } = await db.query<{ "QUERY PLAN": { Plan: Record<string, unknown> }[] }>(
          `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE settle_long_run_${commit.name}(${commit.bind(params).map(literal).join(", ")})`,
        );
        expect(rowsRead(rows[0]!["QUERY PLAN"][0]!.Plan, "tool_invocations")).toBe(1);
        const { rows: settled } = await db.query<{ status: string }>("SELECT status FROM tool_invocations WHERE id = $1", [invocationId]);
        expect(settled[0]?.status).toBe("succeeded");
      } finally {
        await db.query("ROLLBACK");
      }
    });
  }

  it("would catch a scan", async () => {
    expect(await scans("SELECT id FROM messages WHERE id = $1::uuid OR ($2::boolean AND text = $3)")).toContain("messages");
  });
});
