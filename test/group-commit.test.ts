// Group commit against a real PostgreSQL: fenced commits of different runs that arrive while one
// is being written share one transaction (their rows carry one xmin), each still fenced on its
// own (a lost lease refuses only its commit), and a batch one commit breaks is retried commit by
// commit, so only that one fails. Also: a batch does not wait long behind another's row lock.
import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { migrateLedger } from "../control-plane/src/ledger/orm.js";
import { createSqlPool, type SqlPool } from "../control-plane/src/ledger/sql.js";
import { createStepCommitRepository } from "../control-plane/src/ledger/step-commit.repository.js";
import type { StepCommit } from "../control-plane/src/runner/run-store.js";
import { createTestDatabase } from "./support/keel-fixture.js";
import { seedConversation, seedHeldRun } from "./support/run-seed.js";

const OWNERS = { agent: "gc-agent", actor: "gc-actor", conversation: "00000000-0000-4000-8000-000000000001" };
let url: string;
let db: pg.Client;
let sql: SqlPool;

beforeAll(async () => {
  url = await createTestDatabase();
  await migrateLedger({ url });
  db = new pg.Client({ connectionString: url });
  await db.connect();
  await seedConversation(db, OWNERS);
  sql = createSqlPool({ url, max: 4 });
});

afterAll(async () => {
  await sql?.close();
  await db?.end();
});

const heldRun = (): Promise<string> => seedHeldRun(db, OWNERS);

function stepCommit(runId: string, options: { epoch?: number; stepId?: string } = {}): StepCommit {
  return {
    runId,
    workerId: "w",
    epoch: options.epoch ?? 1,
    step: { id: options.stepId ?? randomUUID(), index: 0, replayability: "replayable", actorId: undefined, startedAt: new Date(), modelCall: undefined, invocations: [] },
    status: "running",
    usage: { iterations: 1, modelCalls: 0, inputTokens: 0, outputTokens: 0, outputBytes: 0, costMicroUsd: 0, wallClockMs: 0 } as StepCommit["usage"],
    emissions: [],
    summary: "a step",
  };
}

const settle = <T>(promise: Promise<T>) => promise.then((value) => ({ value }), (error: unknown) => ({ error }));
const errorOf = (outcome: { value: unknown } | { error: unknown } | undefined): unknown => (outcome !== undefined && "error" in outcome ? outcome.error : undefined);

async function stepsOf(runIds: readonly string[]): Promise<Map<string, string>> {
  const { rows } = await db.query<{ run_id: string; xmin: string }>("SELECT run_id, xmin::text AS xmin FROM run_steps WHERE run_id = ANY($1::uuid[])", [runIds]);
  return new Map(rows.map((row) => [row.run_id, row.xmin]));
}

describe("group commit of fenced step commits", () => {
  it("commits runs arriving behind a busy slot in one transaction, each fenced on its own", async () => {
    const repository = createStepCommitRepository(sql, "strict", { maxInFlight: 1, maxBatch: 32 });
    const [first, ...rest] = await Promise.all(Array.from({ length: 5 }, heldRun));
    const stale = rest[1]!;
    const firstCommit = repository.commitStep(stepCommit(first!));
    // Sent while the first is out: they wait for its slot and go together.
    const others = rest.map((runId) => settle(repository.commitStep(stepCommit(runId, { epoch: runId === stale ? 0 : 1 }))));
    await firstCommit;
    const outcomes = await Promise.all(others);
    expect(errorOf(outcomes[1])).toBeInstanceOf(LeaseLostError);
    for (const [i, outcome] of outcomes.entries()) if (i !== 1) expect(outcome).toMatchObject({ value: { paused: false } });

    const steps = await stepsOf([first!, ...rest]);
    expect(steps.has(stale)).toBe(false);
    const together = rest.filter((runId) => runId !== stale).map((runId) => steps.get(runId));
    expect(new Set(together).size).toBe(1);
    expect(together[0]).not.toBe(steps.get(first!));
    const { rows } = await db.query<{ id: string; step_count: number; event_seq: number }>("SELECT id, step_count, event_seq FROM runs WHERE id = ANY($1::uuid[])", [rest]);
    for (const row of rows) expect([row.step_count, row.event_seq]).toEqual(row.id === stale ? [0, 0] : [1, 1]);
  });

  it("retries a batch that one commit breaks commit by commit: the others are kept, that one fails", async () => {
    const repository = createStepCommitRepository(sql, "strict", { maxInFlight: 1, maxBatch: 32 });
    const [first, ...rest] = await Promise.all(Array.from({ length: 4 }, heldRun));
    const taken = randomUUID();
    const firstCommit = repository.commitStep(stepCommit(first!, { stepId: taken }));
    const clash = rest[1]!;
    const others = rest.map((runId) => settle(repository.commitStep(stepCommit(runId, runId === clash ? { stepId: taken } : {}))));
    await firstCommit;
    const outcomes = await Promise.all(others);
    expect((errorOf(outcomes[1]) as { code?: string } | undefined)?.code).toBe("23505");
    expect(outcomes[0]).toHaveProperty("value");
    expect(outcomes[2]).toHaveProperty("value");
    const steps = await stepsOf(rest);
    expect([...steps.keys()].sort()).toEqual([rest[0]!, rest[2]!].sort());
    // Each kept on its own, after the batch was rolled back.
    expect(steps.get(rest[0]!)).not.toBe(steps.get(rest[2]!));
  });

  it("gives up a row lock another transaction holds for long, then commits once it is free", async () => {
    const repository = createStepCommitRepository(sql, "strict", { maxInFlight: 1, maxBatch: 32 });
    const [first, locked, free] = await Promise.all(Array.from({ length: 3 }, heldRun));
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT id FROM runs WHERE id = $1 FOR NO KEY UPDATE", [locked]);
      const firstCommit = repository.commitStep(stepCommit(first!));
      const lockedCommit = repository.commitStep(stepCommit(locked!));
      const freeCommit = repository.commitStep(stepCommit(free!));
      await firstCommit;
      // The batch of the two times out on the lock and is retried one by one: the free run does
      // not wait for the holder, the locked one does.
      await freeCommit;
      expect((await stepsOf([locked!, free!])).has(free!)).toBe(true);
      expect((await stepsOf([locked!])).has(locked!)).toBe(false);
      await holder.query("COMMIT");
      await lockedCommit;
      expect((await stepsOf([locked!])).has(locked!)).toBe(true);
    } finally {
      await holder.end();
    }
  });
});
