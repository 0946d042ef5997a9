// Group commit against a real PostgreSQL: fenced commits of different runs that arrive while one
// is being written share one transaction (their rows carry one xmin), each still fenced on its
// own (a lost lease refuses only its commit), and a batch one commit breaks is retried commit by
// commit, so only that one fails. Also: a batch does not wait long behind another's row lock.
import { randomUUID } from "node:crypto";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { createStepCommitRepository } from "../control-plane/src/ledger/step-commit.repository.js";
import { fencedBatchCommit, fencedBatchParams } from "../control-plane/src/ledger/step-commit-batch.sql.js";
import { fencedCommitParams } from "../control-plane/src/ledger/step-commit-params.js";
import type { StepCommit } from "../control-plane/src/runner/run-store.js";
import { seedHeldRun } from "./support/run-seed.js";
import { seededLedger } from "./support/seeded-ledger.js";

const OWNERS = { agent: "gc-agent", actor: "gc-actor", conversation: "00000000-0000-4000-8000-000000000001" };
const ledger = seededLedger(OWNERS, 4);

const heldRun = (): Promise<string> => seedHeldRun(ledger.db, OWNERS);

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
  const { rows } = await ledger.db.query<{ run_id: string; xmin: string }>("SELECT run_id, xmin::text AS xmin FROM run_steps WHERE run_id = ANY($1::uuid[])", [runIds]);
  return new Map(rows.map((row) => [row.run_id, row.xmin]));
}

describe("group commit of fenced step commits", () => {
  it("commits runs arriving behind a busy slot in one transaction, each fenced on its own", async () => {
    const repository = createStepCommitRepository(ledger.sql, "strict", { maxInFlight: 1, maxBatch: 32 });
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
    const { rows } = await ledger.db.query<{ id: string; step_count: number; event_seq: number }>("SELECT id, step_count, event_seq FROM runs WHERE id = ANY($1::uuid[])", [rest]);
    for (const row of rows) expect([row.step_count, row.event_seq]).toEqual(row.id === stale ? [0, 0] : [1, 1]);
  });

  it("retries a batch that one commit breaks commit by commit: the others are kept, that one fails", async () => {
    const repository = createStepCommitRepository(ledger.sql, "strict", { maxInFlight: 1, maxBatch: 32 });
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
    const repository = createStepCommitRepository(ledger.sql, "strict", { maxInFlight: 1, maxBatch: 32 });
    const [first, locked, free] = await Promise.all(Array.from({ length: 3 }, heldRun));
    const holder = new pg.Client({ connectionString: ledger.url });
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

describe("a batch as one set-oriented statement", () => {
  /** Everything a run's commits left in the ledger, ids and times left out, to compare two runs. */
  async function ledgerOf(runId: string): Promise<unknown> {
    const rows = async (text: string): Promise<unknown[]> =>
      (await ledger.db.query<Record<string, unknown>>(text, [runId])).rows.map((row) => JSON.parse(JSON.stringify(row).replaceAll(runId, "RUN")) as unknown);
    return {
      run: await rows("SELECT status, step_count, event_seq, final_reply, lease_owner FROM runs WHERE id = $1"),
      events: await rows("SELECT seq, kind, status, summary, step_id IS NOT NULL AS on_step, tool_invocation_id IS NOT NULL AS on_call FROM run_event_feed WHERE run_id = $1 ORDER BY seq"),
      steps: await rows("SELECT index, run_status_after, lease_epoch FROM run_steps WHERE run_id = $1 ORDER BY index"),
      calls: await rows("SELECT s.index, m.model, m.input_tokens, m.request FROM model_calls m JOIN run_steps s ON s.id = m.step_id WHERE m.run_id = $1 ORDER BY s.index"),
      tools: await rows("SELECT provider_call_id, tool_name, status, result_text FROM tool_invocations WHERE run_id = $1 ORDER BY provider_call_id"),
      observations: await rows("SELECT o.seq, o.stream, o.text FROM observations o WHERE o.run_id = $1 ORDER BY o.text"),
      emissions: await rows("SELECT kind, text, idempotency_key FROM emissions WHERE run_id = $1"),
    };
  }

  const modelCall = (n: number) => ({
    id: randomUUID(),
    role: "primary" as const,
    provider: "scripted",
    model: `m${n}`,
    request: { messages: [{ role: "user", content: `turn ${n}` }], tools: [] },
    responseText: "",
    toolCalls: [],
    inputTokens: 10 + n,
    outputTokens: 1,
    latencyMs: 0,
    finishReason: "tool_calls",
    costMicroUsd: 0,
  });
  const read = (n: number) => ({ id: randomUUID(), providerCallId: `call-${n}`, ordinal: 0, toolName: "kv.read", toolVersion: "1", effect: "read" as const, argumentsJson: "{}", status: "pending" as const });

  /** Each run's second step, settling its first step's read; the last run replies and ends instead. */
  async function iterate(repository: ReturnType<typeof createStepCommitRepository>, runs: readonly string[], slot: string): Promise<void> {
    const first = await Promise.all(runs.map(async (runId) => {
      const intent = read(0);
      await repository.commitStep({ ...stepCommit(runId), step: { ...stepCommit(runId).step!, modelCall: modelCall(0), invocations: [intent] }, summary: "1 tool call(s) to dispatch" });
      return intent.id;
    }));
    const busy = repository.commitStep(stepCommit(slot));
    const second = runs.map((runId, i) => {
      const last = i === runs.length - 1;
      const prior = [{ invocationId: first[i]!, effect: "read" as const, outcome: "succeeded" as const, resultText: `value ${i}`, artifacts: [] }];
      return repository.commitStep({
        ...stepCommit(runId),
        step: { ...stepCommit(runId).step!, index: 1, modelCall: modelCall(1), invocations: last ? [] : [read(1)] },
        priorOutcomes: prior,
        status: last ? "succeeded" : "running",
        finalReply: last ? "done" : undefined,
        emissions: last ? [{ idempotencyKey: `reply-${runId}`, kind: "reply", text: "done", addressedActorIds: [] }] : [],
        summary: last ? "replied" : "1 tool call(s) to dispatch",
      } as StepCommit);
    });
    await busy;
    await Promise.all(second);
  }

  it("writes each run's rows exactly as that run's commit alone would", async () => {
    const alone = await Promise.all(Array.from({ length: 3 }, heldRun));
    await iterate(createStepCommitRepository(ledger.sql, "strict", { maxInFlight: 1, maxBatch: 1 }), alone, await heldRun());
    const batched = await Promise.all(Array.from({ length: 3 }, heldRun));
    await iterate(createStepCommitRepository(ledger.sql, "strict", { maxInFlight: 1, maxBatch: 32 }), batched, await heldRun());

    // The three second steps went as one transaction; alone, as three.
    const { rows } = await ledger.db.query<{ run_id: string; xmin: string }>("SELECT run_id, xmin::text AS xmin FROM run_steps WHERE run_id = ANY($1::uuid[]) AND index = 1", [[...alone, ...batched]]);
    const xmins = (runs: readonly string[]) => new Set(rows.filter((row) => runs.includes(row.run_id)).map((row) => row.xmin)).size;
    expect([xmins(alone), xmins(batched)]).toEqual([3, 1]);
    for (const [i, runId] of batched.entries()) expect(await ledgerOf(runId)).toEqual(await ledgerOf(alone[i]!));
    const ended = (await ledgerOf(batched[2]!)) as { run: { status: string }[]; emissions: unknown[]; events: { kind: string }[] };
    expect(ended.run[0]?.status).toBe("succeeded");
    expect(ended.emissions).toHaveLength(1);
  });

  it("answers each commit with its own run's emissions and wake-up, and nothing for one whose lease is gone", async () => {
    const [quiet, replying, stale] = await Promise.all(Array.from({ length: 3 }, heldRun));
    const params = (runId: string, epoch: number, extra: Partial<StepCommit>) => {
      const commit = { ...stepCommit(runId, { epoch }), ...extra };
      return fencedCommitParams(commit, commit, { step: commit.step, outcomes: [], crossesCommitBoundary: false, writes: false, events: [], unlessChangedSince: undefined }, "strict");
    };
    const batch = [
      params(quiet!, 1, {}),
      params(replying!, 1, { status: "succeeded", finalReply: "done", emissions: [{ idempotencyKey: `reply-${replying!}`, kind: "reply", text: "done", addressedActorIds: [] }] }),
      params(stale!, 0, { status: "queued" }),
    ];
    const { rows } = await ledger.db.query<{ ord: number; id: string; emitted: number; woken: boolean }>({
      text: fencedBatchCommit.text,
      values: fencedBatchCommit.bind(fencedBatchParams(batch, "on")),
    });
    expect(rows.map((row) => [row.ord, row.id, row.emitted, row.woken])).toEqual([
      [0, quiet, 0, false],
      [1, replying, 1, false],
    ]);
  });
});
