// Retention (issue #12, item 11): finished runs past the configured age are deleted with every
// row recorded about them, by the server's sweeper and by `keel gc`; live runs, and finished runs
// a live run still inherits from, stay. Runs are real (a served demo agent); ages are set in SQL.
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { promisify } from "node:util";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { gcCommand } from "../control-plane/src/cli/gc-command.js";
import { loadConfig } from "../control-plane/src/config.js";
import { createRetentionRepository } from "../control-plane/src/ledger/retention.repository.js";
import { createSqlPool, type SqlPool } from "../control-plane/src/ledger/sql.js";
import { connectClient } from "./support/clients.js";
import { KEEL_BIN, waitFor } from "./support/child-processes.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedToolCall } from "./support/run-seed.js";

/** Every table with a run_id column, and how rows of a run are found in it. */
const RUN_TABLES = ["run_steps", "model_calls", "tool_invocations", "observations", "artifacts", "run_events", "run_triggers", "emissions", "messages"];

describe("retention of finished runs", () => {
  let keel: TestKeel;
  let db: pg.Client;
  let pool: SqlPool;
  let connectorToken: string;

  const finishedRun = async (conversationId: string): Promise<string> => {
    const ingress = connectClient(IngressService, keel.url, connectorToken);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { runId } = await ingress.submitMessage({
      agentId: "demo",
      conversationId,
      actor: { id: "alice", displayName: "Alice" },
      messageId: randomUUID(),
      text: "hello",
      connector: "retention-test",
    });
    await waitFor(`run ${runId} to finish`, async () => ((await runs.getRun({ runId })).run?.status === RunStatus.SUCCEEDED ? true : undefined));
    return runId;
  };
  const age = (runId: string, days: number) =>
    db.query("UPDATE runs SET finished_at = now() - make_interval(days => $2) WHERE id = $1", [runId, days]);
  const rowsOf = async (runId: string): Promise<Record<string, number>> => {
    const counts: Record<string, number> = {};
    for (const table of [...RUN_TABLES, "runs"]) {
      const column = table === "runs" ? "id" : "run_id";
      const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [runId]);
      counts[table] = rows[0]?.n ?? 0;
    }
    return counts;
  };
  const stepOf = async (runId: string): Promise<string> =>
    (await db.query<{ id: string }>("SELECT id FROM run_steps WHERE run_id = $1 ORDER BY index LIMIT 1", [runId])).rows[0]!.id;

  beforeAll(async () => {
    keel = await startTestKeel();
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    pool = createSqlPool({ url: keel.databaseUrl, max: 2 });
    // Scoped to this test's connector where tokens carry scopes (issue #12); the scope is ignored where they do not.
    const create = keel.app.tokens.create.bind(keel.app.tokens) as (role: "connector", label: string, options: object) => Promise<{ secret: string }>;
    connectorToken = (await create("connector", "retention", { scope: { kind: "connector", connectors: ["retention-test"], agents: "any" } })).secret;
  });
  afterAll(async () => {
    await pool?.close();
    await db?.end();
    await keel?.stop();
  });

  it("deletes old finished runs with everything recorded about them, keeps live runs and what they inherit", async () => {
    const [oldA, oldB, inherited, recent] = [
      await finishedRun("ret-a"),
      await finishedRun("ret-b"),
      await finishedRun("ret-heir"),
      await finishedRun("ret-recent"),
    ];
    await seedToolCall(db, { runId: oldA, stepId: await stepOf(oldA), observations: ["line 1\n", "line 2\n"], artifact: true });
    for (const id of [oldA, oldB, inherited]) await age(id, 40);
    // A live run (waiting for an operator) that inherits the old run's work.
    const heir = randomUUID();
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, inherits_from_run_id)
       SELECT $1, agent_id, conversation_id, connector, 'waiting', requested_by_actor_id, budget, usage, id FROM runs WHERE id = $2`,
      [heir, inherited],
    );
    // A run not finished never goes, whatever its timestamps say.
    const stuck = randomUUID();
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, finished_at)
       SELECT $1, agent_id, conversation_id, connector, 'awaiting_input', requested_by_actor_id, budget, usage, now() - interval '90 days'
       FROM runs WHERE id = $2`,
      [stuck, recent],
    );
    const before = await rowsOf(oldA);
    expect(before).toMatchObject({ runs: 1, observations: 2, artifacts: 1, tool_invocations: 1, messages: 1, run_triggers: 1 });
    expect(before["run_steps"]).toBeGreaterThan(0);
    expect(before["emissions"]).toBeGreaterThan(0);
    expect(before["run_events"]).toBeGreaterThan(0);

    // keel gc --dry-run counts exactly what would go and changes nothing.
    const lines: string[] = [];
    const config = () => loadConfig({ DATABASE_URL: keel.databaseUrl, KEEL_DB_POOL_MAX: "2" });
    expect(await gcCommand(["--older-than", "30d", "--dry-run"], config, (line) => lines.push(line))).toBe(0);
    expect(lines[0]).toMatch(/^would delete runs finished before /);
    expect(lines).toContain("  runs: 2");
    expect(lines).toContain("  observations: 2");
    expect(await rowsOf(oldA)).toEqual(before);

    // The server's sweeper (the ledger's default retention_days, 30) deletes them.
    await keel.app.retention.sweepNow();
    for (const id of [oldA, oldB]) expect(Object.values(await rowsOf(id)).every((n) => n === 0), id).toBe(true);
    for (const id of [inherited, heir, stuck, recent]) expect((await rowsOf(id))["runs"], id).toBe(1);
    expect((await rowsOf(inherited))["run_steps"]).toBeGreaterThan(0);

    // Once the heir is finished and old too, both go; one run per batch still passes the pinned one by.
    await db.query("UPDATE runs SET status = 'cancelled', finished_at = now() - interval '35 days' WHERE id = $1", [heir]);
    const retention = createRetentionRepository(pool);
    const cutoff = new Date(Date.now() - 30 * 86_400_000);
    const first = await retention.sweep({ finishedBefore: cutoff, batchSize: 1 });
    expect(first.runs).toBe(1);
    expect((await rowsOf(heir))["runs"]).toBe(0);
    expect((await retention.sweep({ finishedBefore: cutoff, batchSize: 1 })).runs).toBe(1);
    expect((await rowsOf(inherited))["runs"]).toBe(0);
    expect((await rowsOf(stuck))["runs"]).toBe(1);
  });

  it("keel gc runs as a command on the ledger and prints what it would remove", async () => {
    const old = await finishedRun("ret-cli");
    await age(old, 10);
    const { stdout } = await promisify(execFile)(process.execPath, [KEEL_BIN, "gc", "--older-than", "1w", "--dry-run"], {
      env: { ...process.env, DATABASE_URL: keel.databaseUrl, KEEL_LOG_LEVEL: "silent" },
      timeout: 60_000,
    });
    expect(stdout).toMatch(/^would delete runs finished before \S+:\n {2}runs: 1\n/);
    expect((await rowsOf(old))["runs"]).toBe(1);
  });

  it("gc refuses an age it cannot read, and retention_days 0 keeps everything", async () => {
    // The deprecated variable seeds the ledger's setting, which nobody has set yet.
    const config = () => loadConfig({ DATABASE_URL: keel.databaseUrl, KEEL_RETENTION_DAYS: "0" });
    const lines: string[] = [];
    expect(await gcCommand(["--older-than", "0d"], config, (line) => lines.push(line))).toBe(2);
    expect(await gcCommand([], config, (line) => lines.push(line))).toBe(0);
    expect(lines).toEqual(["retention is off (the install's retention_days is 0): nothing deleted; pass --older-than to collect anyway"]);
    expect((await keel.app.installSettings.get()).retentionDays).toBe(0);
  });
});
