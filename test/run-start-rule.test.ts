// The run-start rule has one definition (domain/run-start.ts) and one SQL rendering
// (ledger/run-start.sql.ts), over facts read per run or for all runs at once. This property test
// generates small ledgers, writes each into a real migrated PostgreSQL, and checks that the SQL
// gives every run the reason the domain gives, with either kind of facts. The install's ceiling is
// read from the ledger's settings row, as in production, so each case writes it there.
import fc from "fast-check";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentCeiling, startBlocker, type StartFacts } from "../control-plane/src/domain/run-start.js";
import { RUN_STATUSES } from "../control-plane/src/domain/run.js";
import { claimStartLocksSql, FACTS_LOCKED, FACTS_SET, FACTS_SET_CTES, startBlockerSql } from "../control-plane/src/ledger/run-start.sql.js";
import { raw, statement } from "../control-plane/src/ledger/sql.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

interface Params {
  readonly now: Date;
}
const now = (p: Params) => p.now;
const blockers = statement<Params, { id: string; reason: string | null }>("test_run_start_blockers")`
  SELECT r.id, ${startBlockerSql<Params>({ now })} AS reason
  FROM runs r JOIN agents a ON a.id = r.agent_id`;

/** The same rule over the facts a claim's candidate query computes for all runs at once (used for queued runs). */
const blockersFromSetFacts = statement<Params, { id: string; reason: string | null }>("test_run_start_blockers_set_facts")`
  WITH ${raw(FACTS_SET_CTES)}
  SELECT r.id, ${startBlockerSql<Params>({ now }, FACTS_SET)} AS reason
  FROM runs r JOIN agents a ON a.id = r.agent_id LEFT JOIN executing e ON e.agent_id = r.agent_id
  WHERE r.status = 'queued'`;

/**
 * The same rule as a claim's re-check reads it: counts taken under the start locks for one agent.
 * The generated install ceiling (at most 4) is below the slot count, so the locks are taken
 * exclusively and the counts carry no margin: the answer must equal the domain's.
 */
const blockersFromLockedFacts = statement<Params & { agentId: string }, { id: string; reason: string | null }>("test_run_start_blockers_locked_facts")`
  WITH locked AS ${claimStartLocksSql<Params & { agentId: string }>((p) => p.agentId, () => true)}
  SELECT r.id, ${startBlockerSql<Params & { agentId: string }>({ now }, FACTS_LOCKED)} AS reason
  FROM runs r JOIN agents a ON a.id = r.agent_id LEFT JOIN locked ON true
  WHERE r.agent_id = ${(p) => p.agentId}`;

const T0 = Date.parse("2026-12-01T12:00:00Z");
const AGENTS = ["agent-a", "agent-b"] as const;
const CONVERSATIONS = ["00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"] as const;

const runArb = fc.record({
  agent: fc.integer({ min: 0, max: 1 }),
  conversation: fc.integer({ min: 0, max: 2 }),
  // Queued runs are what the rule judges, so they are drawn most often.
  status: fc.oneof({ arbitrary: fc.constant("queued" as const), weight: 3 }, { arbitrary: fc.constantFrom(...RUN_STATUSES), weight: 2 }),
  paused: fc.integer({ min: 0, max: 3 }).map((n) => n === 0),
  isRoot: fc.boolean(),
  started: fc.boolean(),
  notBeforeS: fc.integer({ min: -2, max: 2 }),
  receivedS: fc.integer({ min: 0, max: 3 }),
  createdS: fc.integer({ min: 0, max: 3 }),
});
const worldArb = fc.record({
  runs: fc.array(runArb, { minLength: 1, maxLength: 8 }),
  agentCeilings: fc.tuple(fc.integer({ min: 0, max: 3 }), fc.integer({ min: 0, max: 3 })),
  installCeiling: fc.integer({ min: 1, max: 4 }),
});

describe("the run-start rule, in SQL and in the domain", () => {
  let keel: TestKeel;
  let db: pg.Client;

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 0 });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
  });

  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });

  it("gives every run of a generated ledger the same wait reason (or none)", async () => {
    await fc.assert(
      fc.asyncProperty(worldArb, async (world) => {
        const facts: StartFacts[] = world.runs.map((run, i) => ({
          id: `00000000-0000-4000-9000-${String(i + 1).padStart(12, "0")}`,
          agentId: AGENTS[run.agent]!,
          conversationId: CONVERSATIONS[run.conversation]!,
          status: run.status,
          paused: run.paused,
          isRoot: run.isRoot || i === 0,
          started: run.started,
          notBefore: new Date(T0 + run.notBeforeS * 1000),
          requestReceivedAt: new Date(T0 + run.receivedS * 1000),
          createdAt: new Date(T0 + run.createdS * 1000),
        }));
        const ceilings = new Map<string, number>(AGENTS.map((id, i) => [id, world.agentCeilings[i]!]));
        const expected = new Map(
          facts.map((run) => [
            run.id,
            startBlocker(run, {
              runs: facts,
              agentCeilingOf: (id) => agentCeiling(ceilings.get(id)),
              installCeiling: world.installCeiling,
              now: new Date(T0),
            }) ?? null,
          ]),
        );
        await db.query("BEGIN");
        try {
          await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
          await db.query("UPDATE install_settings SET root_run_ceiling = $1 WHERE id = 1", [world.installCeiling]);
          for (const id of AGENTS) {
            const spec = { ...DEMO_AGENT, id, maxConcurrentRootRuns: ceilings.get(id) };
            await db.query("INSERT INTO agents (id, spec, revision) VALUES ($1, $2, 1)", [id, JSON.stringify(spec)]);
          }
          for (const [i, id] of CONVERSATIONS.entries()) {
            await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [id, AGENTS[i % 2], `c${i}`]);
          }
          const root = facts[0]!.id;
          for (const run of facts) {
            await db.query(
              `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, paused,
                 parent_run_id, root_run_id, started_at, not_before, request_received_at, created_at)
               VALUES ($1, $2, $3, 'test', $4, 'someone', '{}', '{}', $5, $6, $6, $7, $8, $9, $10)`,
              [run.id, run.agentId, run.conversationId, run.status, run.paused, run.isRoot ? null : root,
                run.started ? new Date(T0) : null, run.notBefore, run.requestReceivedAt, run.createdAt],
            );
          }
          const result = await db.query<{ id: string; reason: string | null }>({
            text: blockers.text,
            values: blockers.bind({ now: new Date(T0) }),
          });
          const actual = new Map(result.rows.map((row) => [row.id, row.reason]));
          expect(actual).toEqual(expected);
          const fromSet = await db.query<{ id: string; reason: string | null }>({
            text: blockersFromSetFacts.text,
            values: blockersFromSetFacts.bind({ now: new Date(T0) }),
          });
          const queued = new Map([...expected].filter(([id]) => facts.find((run) => run.id === id)?.status === "queued"));
          expect(new Map(fromSet.rows.map((row) => [row.id, row.reason]))).toEqual(queued);
          for (const agentId of AGENTS) {
            const fromLocked = await db.query<{ id: string; reason: string | null }>({
              text: blockersFromLockedFacts.text,
              values: blockersFromLockedFacts.bind({ now: new Date(T0), agentId }),
            });
            const ofAgent = new Map([...expected].filter(([id]) => facts.find((run) => run.id === id)?.agentId === agentId));
            expect(new Map(fromLocked.rows.map((row) => [row.id, row.reason]))).toEqual(ofAgent);
          }
        } finally {
          await db.query("ROLLBACK");
        }
      }),
      { numRuns: 300 },
    );
  });
});
