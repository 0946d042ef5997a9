// Lease fencing with real processes (test/support/fault-serve.ts, no fault):
//  (a) a zombie worker: process A is frozen (SIGSTOP) mid model call, B reclaims the run at a
//      higher epoch and finishes it; when A wakes, its commit is refused by the fence.
//  (b) two processes on one database share 200 runs: each run claimed exactly once.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { killAllChildren, prepareLedger, sleep, startFaultServe, waitFor } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { scriptedAgent, scriptedTurn } from "../control-plane/src/fixtures/scripted-model.js";
import { createTestDatabase } from "./support/keel-fixture.js";


/** The demo agent with one scripted reply that takes `delayMs`. */
function replyAgent(id: string, delayMs: number): AgentSpec {
  return scriptedAgent(id, [scriptedTurn("Hello. You said: {{message}}", [], { delayMs })], { displayName: `scripted reply after ${delayMs} ms` });
}

// ---- helpers ---------------------------------------------------------------------------

/** `worker-<8 hex process id>-<i>` → the process id. */
function processOf(workerId: string | null | undefined): string | undefined {
  return /^worker-([0-9a-f]{8})-\d+$/.exec(workerId ?? "")?.[1];
}

function logEntries(output: readonly string[]): { level: number; msg: string }[] {
  return output.flatMap((line) => {
    try {
      const entry = JSON.parse(line) as { level?: unknown; msg?: unknown };
      return typeof entry.level === "number" && typeof entry.msg === "string" ? [{ level: entry.level, msg: entry.msg }] : [];
    } catch {
      return [];
    }
  });
}

const cleanups: (() => Promise<void>)[] = [];

async function setUp(agent: AgentSpec): Promise<{ databaseUrl: string; effectsDir: string; db: pg.Client; token: string }> {
  const databaseUrl = await createTestDatabase();
  const effectsDir = await mkdtemp(path.join(tmpdir(), "keel-lease-fencing-"));
  const db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  cleanups.push(async () => {
    await db.end().catch(() => {});
    await rm(effectsDir, { recursive: true, force: true });
  });
  const token = await prepareLedger(databaseUrl, [agent]);
  return { databaseUrl, effectsDir, db, token };
}

describe("lease fencing across processes", () => {
  afterEach(async () => {
    await killAllChildren();
  });
  afterAll(async () => {
    await killAllChildren();
    for (const cleanup of cleanups.splice(0)) await cleanup();
  });

  it("a frozen worker's run is reclaimed at a higher epoch, and the frozen worker commits nothing when it wakes", { timeout: 90_000 }, async () => {
    // A's model call outlasts B's start (≈2 s idle, over 5 s on a loaded machine) by far, so A
    // freezes inside it; B starts with the same agent answering quickly (each process puts the
    // agent it is given), so its reclaim does not wait out the same delay.
    const MODEL_DELAY_MS = 60_000;
    const agent = replyAgent("zombie", MODEL_DELAY_MS);
    const { databaseUrl, effectsDir, db, token } = await setUp(agent);
    const env = {
      DATABASE_URL: databaseUrl,
      KEEL_EFFECTS_DIR: effectsDir,
      KEEL_TEST_AGENTS: JSON.stringify([agent]),
      KEEL_LEASE_MS: "1000",
      KEEL_IDLE_POLL_MS: "200",
      KEEL_WORKERS: "2",
      KEEL_DB_POOL_MAX: "5",
      KEEL_LOG_LEVEL: "info",
    };
    const runState = async (runId: string) =>
      (
        await db.query<{ status: string; lease_owner: string | null; lease_epoch: string }>(
          "SELECT status, lease_owner, lease_epoch FROM runs WHERE id = $1",
          [runId],
        )
      ).rows[0];
    const committed = async (runId: string) =>
      Number((await db.query<{ n: string }>("SELECT count(*) AS n FROM run_steps WHERE run_id = $1", [runId])).rows[0]?.n ?? 0);

    const a = await startFaultServe(env);
    const { runId } = await connectClient(IngressService, a.url, token).submitMessage({
      agentId: agent.id,
      conversationId: "zombie",
      actor: { id: "alice", displayName: "Alice" },
      messageId: "m-zombie",
      text: "hello",
      connector: "lease-test",
    });
    const claimedByA = await waitFor(
      "A to claim the run",
      async () => {
        const run = await runState(runId);
        return run?.status === "running" && run.lease_owner !== null ? run : undefined;
      },
      10_000,
    );
    const claimedAt = Date.now();
    const processA = processOf(claimedByA.lease_owner);
    expect(processA, `lease owner ${String(claimedByA.lease_owner)}`).toBeDefined();
    expect(Number(claimedByA.lease_epoch)).toBe(1);

    // B comes up while A is in its slow model call; then A freezes: no renewals, no commits.
    const b = await startFaultServe({ ...env, KEEL_TEST_AGENTS: JSON.stringify([replyAgent("zombie", 200)]) });
    a.process.kill("SIGSTOP");
    const frozenAfterMs = Date.now() - claimedAt;
    // The precondition of the whole test: A froze before its model call could finish.
    expect(await committed(runId), `A froze ${frozenAfterMs} ms after claiming; its step had already committed`).toBe(0);

    const reclaimed = await waitFor(
      "B to reclaim the run at epoch 2",
      async () => {
        const run = await runState(runId);
        return run !== undefined && Number(run.lease_epoch) === 2 ? run : undefined;
      },
      15_000,
    );
    const reclaimedAfterMs = Date.now() - claimedAt - frozenAfterMs;
    const processB = processOf(reclaimed.lease_owner);
    expect(processB).toBeDefined();
    expect(processB).not.toBe(processA);
    await waitFor("B to finish the run", async () => ((await runState(runId))?.status === "succeeded" ? true : undefined), 20_000);

    // A wakes: its model call returns, it tries to commit at epoch 1, and the fence refuses.
    a.process.kill("SIGCONT");
    await sleep(2_000);
    expect(a.process.exitCode).toBeNull(); // still alive: a lost lease is not a crash

    const steps = await db.query<{ lease_epoch: string }>("SELECT lease_epoch FROM run_steps WHERE run_id = $1", [runId]);
    const modelCalls = await db.query<{ n: string }>("SELECT count(*) AS n FROM model_calls WHERE run_id = $1", [runId]);
    const replies = await db.query<{ text: string }>("SELECT text FROM emissions WHERE run_id = $1 AND kind = 'reply'", [runId]);
    const run = await runState(runId);
    const events = await db.query<{ summary: string }>(
      "SELECT summary FROM run_events WHERE run_id = $1 AND kind = 'status_changed' ORDER BY seq",
      [runId],
    );
    expect(run?.status).toBe("succeeded");
    expect(Number(run?.lease_epoch)).toBe(2);
    expect(steps.rows.map((s) => Number(s.lease_epoch))).toEqual([2]);
    expect(Number(modelCalls.rows[0]?.n)).toBe(1);
    expect(replies.rows.map((r) => r.text)).toEqual(["Hello. You said: hello"]);
    const summaries = events.rows.map((e) => e.summary);
    expect(summaries.filter((s) => s.startsWith(`claimed by worker-${processA}-`) && s.endsWith("at epoch 1"))).toHaveLength(1);
    expect(summaries.filter((s) => s.includes(`reclaimed by worker-${processB}-`) && s.endsWith("at epoch 2"))).toHaveLength(1);

    // A noticed: its lease renewal failed and/or its commit was refused, and it said so.
    const leaseWarnings = logEntries(a.output).filter((e) => e.level === 40 && /lease/i.test(e.msg));
    console.log(
      `lease-fencing zombie: A froze ${frozenAfterMs} ms into its ${MODEL_DELAY_MS} ms model call; ` +
        `B reclaimed ${reclaimedAfterMs} ms after the freeze; A warned: ${JSON.stringify(leaseWarnings.map((e) => e.msg))}`,
    );
    expect(leaseWarnings.map((e) => e.msg).join("\n"), `A's output:\n${a.output.slice(-20).join("\n")}`).toMatch(
      new RegExp(`lease on run ${runId} at epoch 1 was taken by another worker|lease lost while working`),
    );
    // B never saw a conflict. (The test PostgreSQL runs with fsync off, which every Keel warns of once.)
    expect(logEntries(b.output).filter((e) => e.level >= 40 && !/fsync off/.test(e.msg))).toEqual([]);
  });

  it("two processes share 200 runs: each claimed exactly once, by workers of both", { timeout: 120_000 }, async () => {
    const RUNS = 200;
    const agent = replyAgent("shared", 20);
    const { databaseUrl, effectsDir, db, token } = await setUp(agent);
    const env = {
      DATABASE_URL: databaseUrl,
      KEEL_EFFECTS_DIR: effectsDir,
      KEEL_TEST_AGENTS: JSON.stringify([agent]),
      KEEL_LEASE_MS: "5000",
      KEEL_IDLE_POLL_MS: "200",
      KEEL_WORKERS: "4",
      KEEL_DB_POOL_MAX: "10",
      KEEL_LOG_LEVEL: "warn",
    };
    const servers = await Promise.all([startFaultServe(env), startFaultServe(env)]);
    const started = Date.now();

    // Submit through both, 20 at a time.
    const runIds: string[] = [];
    for (let batch = 0; batch < RUNS; batch += 20) {
      const ids = await Promise.all(
        Array.from({ length: Math.min(20, RUNS - batch) }, async (_, j) => {
          const i = batch + j;
          const server = servers[i % 2]!;
          const { runId } = await connectClient(IngressService, server.url, token).submitMessage({
            agentId: agent.id,
            conversationId: `shared-${i}`,
            actor: { id: "alice", displayName: "Alice" },
            messageId: `m-${i}`,
            text: `message ${i}`,
            connector: "lease-test",
          });
          return runId;
        }),
      );
      runIds.push(...ids);
    }
    expect(new Set(runIds).size).toBe(RUNS);

    await waitFor(
      "all runs to finish",
      async () => {
        const { rows } = await db.query<{ n: string }>(
          "SELECT count(*) AS n FROM runs WHERE id = ANY($1::uuid[]) AND status IN ('succeeded', 'failed', 'cancelled', 'budget_exhausted')",
          [runIds],
        );
        return Number(rows[0]?.n) === RUNS ? true : undefined;
      },
      90_000,
    );
    const elapsedMs = Date.now() - started;

    const { rows: runs } = await db.query<{ id: string; status: string; lease_epoch: string; step_count: number }>(
      "SELECT id, status, lease_epoch, step_count FROM runs WHERE id = ANY($1::uuid[])",
      [runIds],
    );
    const { rows: stepCounts } = await db.query<{ run_id: string; n: string; epochs: string[] }>(
      "SELECT run_id, count(*) AS n, array_agg(lease_epoch::text) AS epochs FROM run_steps WHERE run_id = ANY($1::uuid[]) GROUP BY run_id",
      [runIds],
    );
    const { rows: replyCounts } = await db.query<{ run_id: string; n: string }>(
      "SELECT run_id, count(*) AS n FROM emissions WHERE run_id = ANY($1::uuid[]) AND kind = 'reply' GROUP BY run_id",
      [runIds],
    );
    const { rows: claims } = await db.query<{ run_id: string; summary: string }>(
      "SELECT run_id, summary FROM run_events WHERE run_id = ANY($1::uuid[]) AND kind = 'status_changed' AND (summary LIKE 'claimed by %' OR summary LIKE '%reclaimed by %')",
      [runIds],
    );

    expect(runs).toHaveLength(RUNS);
    expect(runs.filter((r) => r.status !== "succeeded")).toEqual([]);
    expect(runs.filter((r) => Number(r.lease_epoch) !== 1 || r.step_count !== 1)).toEqual([]);
    expect(stepCounts).toHaveLength(RUNS);
    expect(stepCounts.filter((s) => Number(s.n) !== 1 || s.epochs.join() !== "1")).toEqual([]);
    expect(replyCounts.filter((r) => Number(r.n) === 1)).toHaveLength(RUNS);

    // Claimed exactly once each, never reclaimed: no run was ever held by two workers.
    expect(claims.filter((c) => c.summary.includes("reclaimed by"))).toEqual([]);
    const claimsPerRun = new Map<string, string[]>();
    for (const claim of claims) claimsPerRun.set(claim.run_id, [...(claimsPerRun.get(claim.run_id) ?? []), claim.summary]);
    expect(runIds.filter((id) => claimsPerRun.get(id)?.length !== 1)).toEqual([]);
    const claimers = [...claimsPerRun.values()].map((summaries) => /^claimed by worker-([0-9a-f]{8})-(\d+) at epoch 1$/.exec(summaries[0] ?? ""));
    expect(claimers.filter((m) => m === null)).toEqual([]);
    const perProcess = new Map<string, number>();
    for (const m of claimers) perProcess.set(m![1]!, (perProcess.get(m![1]!) ?? 0) + 1);
    const workers = new Set(claimers.map((m) => `${m![1]}-${m![2]}`));
    console.log(
      `lease-fencing: ${RUNS} runs in ${elapsedMs} ms across ${perProcess.size} processes ` +
        `(${[...perProcess.values()].join(" + ")} runs), ${workers.size} distinct workers`,
    );
    expect(perProcess.size).toBe(2);
    // Neither process saw a lease conflict.
    for (const server of servers) {
      expect(logEntries(server.output).filter((e) => e.level >= 40 && /lease/i.test(e.msg))).toEqual([]);
    }
  });
});
