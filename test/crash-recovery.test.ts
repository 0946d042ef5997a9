// Crash recovery with real processes: `keel serve` runs as a child and is SIGKILLed at the
// two points a run can be caught between durable states. A restarted server must finish the
// run exactly once: one step, one model call, one reply, one settled ack.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { agentSpecToProto } from "../control-plane/src/api/agent-spec-convert.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { killAllChildren, startKeelServe, waitFor, type ServerProcess } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { scriptedAgent, scriptedTurn } from "../control-plane/src/fixtures/scripted-model.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const MODEL_DELAY_MS = 3000;
const LEASE_MS = 1000;

/** The demo agent with a slow model call, so a crash can land in the middle of it. */
function slowAgent(id: string): AgentSpec {
  return scriptedAgent(id, [scriptedTurn("Slow hello. You said: {{message}}", [], { delayMs: MODEL_DELAY_MS })], { displayName: "slow scripted agent" });
}

const cleanups: (() => Promise<void>)[] = [];

/** `node bin/keel.js serve --dev` on the test's database, with a short lease. */
function startKeelChild(options: { databaseUrl: string; dataDir: string; workers: number }): Promise<ServerProcess> {
  return startKeelServe(["--dev"], {
    DATABASE_URL: options.databaseUrl,
    KEEL_DATA_DIR: options.dataDir,
    KEEL_WORKERS: String(options.workers),
    KEEL_LEASE_MS: String(LEASE_MS),
    KEEL_IDLE_POLL_MS: "200",
    KEEL_DB_POOL_MAX: "5",
    KEEL_LOG_LEVEL: "info",
  });
}

async function readToken(dataDir: string): Promise<string> {
  return (await readFile(path.join(dataDir, "dev-token"), "utf8")).trim();
}


interface LedgerFacts {
  status: string;
  steps: { lease_epoch: string }[];
  modelCalls: number;
  replies: number;
  settledAcks: { ack_state: string }[];
  workingAcks: number;
  runLeaseEpoch: number;
}

async function ledgerFacts(db: pg.Client, runId: string): Promise<LedgerFacts> {
  const run = await db.query<{ status: string; lease_epoch: string }>("SELECT status, lease_epoch FROM runs WHERE id = $1", [runId]);
  const steps = await db.query<{ lease_epoch: string }>("SELECT lease_epoch FROM run_steps WHERE run_id = $1", [runId]);
  const calls = await db.query<{ n: string }>("SELECT count(*) AS n FROM model_calls WHERE run_id = $1", [runId]);
  const emissions = await db.query<{ kind: string; ack_state: string | null }>(
    "SELECT kind, ack_state FROM emissions WHERE run_id = $1 ORDER BY seq",
    [runId],
  );
  return {
    status: run.rows[0]?.status ?? "missing",
    steps: steps.rows,
    modelCalls: Number(calls.rows[0]?.n ?? 0),
    replies: emissions.rows.filter((e) => e.kind === "reply").length,
    settledAcks: emissions.rows
      .filter((e) => e.kind === "ack" && (e.ack_state === "succeeded" || e.ack_state === "failed"))
      .map((e) => ({ ack_state: e.ack_state ?? "" })),
    workingAcks: emissions.rows.filter((e) => e.kind === "ack" && e.ack_state === "working").length,
    runLeaseEpoch: Number(run.rows[0]?.lease_epoch ?? -1),
  };
}

async function runStatus(db: pg.Client, runId: string): Promise<string | undefined> {
  const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId]);
  return rows[0]?.status;
}

/** Everything a connector sees from seq 0 until the run's settled ack, plus a short quiet period. */
async function subscribeFromStart(url: string, token: string, connector: string, runId: string): Promise<Emission[]> {
  const client = connectClient(EmissionService, url, token);
  const seen: Emission[] = [];
  const abort = new AbortController();
  const deadline = setTimeout(() => abort.abort(), 20_000);
  let quiet: NodeJS.Timeout | undefined;
  try {
    for await (const { emission } of client.subscribe({ connector, afterSeq: 0n }, { signal: abort.signal })) {
      if (emission === undefined) continue;
      seen.push(emission);
      const settled = emission.runId === runId && emission.kind === EmissionKind.ACK && (emission.ackState === AckState.SUCCEEDED || emission.ackState === AckState.FAILED);
      if (settled && quiet === undefined) quiet = setTimeout(() => abort.abort(), 750); // would a duplicate follow?
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  } finally {
    clearTimeout(deadline);
    clearTimeout(quiet);
    abort.abort();
  }
  return seen;
}

async function setUp(): Promise<{ databaseUrl: string; dataDir: string; db: pg.Client }> {
  const databaseUrl = await createTestDatabase();
  const dataDir = await mkdtemp(path.join(tmpdir(), "keel-crash-"));
  const db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  cleanups.push(async () => {
    await db.end().catch(() => {});
    await rm(dataDir, { recursive: true, force: true });
  });
  return { databaseUrl, dataDir, db };
}

async function putAgent(url: string, token: string, agent: AgentSpec): Promise<void> {
  await connectClient(AgentService, url, token).putAgent({ agent: agentSpecToProto(agent) });
}

describe("crash recovery: SIGKILL the keel process, restart, finish exactly once", () => {
  afterEach(async () => {
    await killAllChildren();
  });
  afterAll(async () => {
    await killAllChildren();
    for (const cleanup of cleanups.splice(0)) await cleanup();
  });

  it("A: killed after SubmitMessage returned and before the model call", async () => {
    const agent = slowAgent("slow-a");
    const { databaseUrl, dataDir, db } = await setUp();

    // No workers: the run is durable but nobody can have claimed it.
    const first = await startKeelChild({ databaseUrl, dataDir, workers: 0 });
    const token = await readToken(dataDir);
    await putAgent(first.url, token, agent);
    const submitted = await connectClient(IngressService, first.url, token).submitMessage({
      agentId: agent.id,
      conversationId: "crash-a",
      actor: { id: "alice", displayName: "Alice" },
      messageId: "m-a",
      text: "before the model",
      connector: "crash-a",
    });
    expect(submitted).toMatchObject({ status: RunStatus.QUEUED, duplicate: false });
    await first.kill();
    expect(first.process.signalCode).toBe("SIGKILL");
    expect(await runStatus(db, submitted.runId)).toBe("queued");

    const second = await startKeelChild({ databaseUrl, dataDir, workers: 2 });
    try {
      await waitFor("the run to succeed", async () => ((await runStatus(db, submitted.runId)) === "succeeded" ? true : undefined));
      const facts = await ledgerFacts(db, submitted.runId);
      expect(facts.status).toBe("succeeded");
      expect(facts.steps).toHaveLength(1);
      expect(Number(facts.steps[0]?.lease_epoch)).toBe(1); // first and only claim
      expect(facts.modelCalls).toBe(1);
      expect(facts.replies).toBe(1);
      expect(facts.settledAcks).toEqual([{ ack_state: "succeeded" }]);
      expect(facts.workingAcks).toBe(1);

      const seen = await subscribeFromStart(second.url, token, "crash-a", submitted.runId);
      const replies = seen.filter((e) => e.kind === EmissionKind.REPLY);
      expect(replies.map((e) => [e.runId, e.text])).toEqual([[submitted.runId, "Slow hello. You said: before the model"]]);
    } finally {
      await second.kill();
    }
  });

  it("B: killed in the middle of the model call; the run is reclaimed after its lease expires", async () => {
    const agent = slowAgent("slow-b");
    const { databaseUrl, dataDir, db } = await setUp();

    const first = await startKeelChild({ databaseUrl, dataDir, workers: 2 });
    const token = await readToken(dataDir);
    await putAgent(first.url, token, agent);
    const submitted = await connectClient(IngressService, first.url, token).submitMessage({
      agentId: agent.id,
      conversationId: "crash-b",
      actor: { id: "bob", displayName: "Bob" },
      messageId: "m-b",
      text: "during the model",
      connector: "crash-b",
    });
    expect(submitted.status).toBe(RunStatus.QUEUED);

    // Claimed (running, epoch 1), and the slow model call is under way: nothing committed yet.
    await waitFor("the run to be claimed", async () => ((await runStatus(db, submitted.runId)) === "running" ? true : undefined));
    const claimedAt = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 300)); // well inside the 3 s model call
    await first.kill();
    expect(Date.now() - claimedAt).toBeLessThan(MODEL_DELAY_MS);
    const afterKill = await ledgerFacts(db, submitted.runId);
    expect(afterKill).toMatchObject({ status: "running", steps: [], modelCalls: 0, replies: 0, settledAcks: [], runLeaseEpoch: 1 });

    const second = await startKeelChild({ databaseUrl, dataDir, workers: 2 });
    try {
      await waitFor("the run to succeed", async () => ((await runStatus(db, submitted.runId)) === "succeeded" ? true : undefined));
      const facts = await ledgerFacts(db, submitted.runId);
      expect(facts.status).toBe("succeeded");
      expect(facts.steps).toHaveLength(1);
      expect(Number(facts.steps[0]?.lease_epoch)).toBe(2); // reclaimed after the lease expired
      expect(facts.runLeaseEpoch).toBe(2);
      expect(facts.modelCalls).toBe(1);
      expect(facts.replies).toBe(1);
      expect(facts.settledAcks).toEqual([{ ack_state: "succeeded" }]);
      expect(facts.workingAcks).toBe(1);

      const { rows: events } = await db.query<{ summary: string }>(
        "SELECT summary FROM run_events WHERE run_id = $1 AND kind = 'status_changed' ORDER BY seq",
        [submitted.runId],
      );
      expect(events.filter((e) => /lease expired.*reclaimed.*epoch 2/.test(e.summary))).toHaveLength(1);

      const seen = await subscribeFromStart(second.url, token, "crash-b", submitted.runId);
      const replies = seen.filter((e) => e.kind === EmissionKind.REPLY);
      expect(replies.map((e) => [e.runId, e.text])).toEqual([[submitted.runId, "Slow hello. You said: during the model"]]);
      expect(seen.filter((e) => e.kind === EmissionKind.ACK && e.ackState === AckState.SUCCEEDED)).toHaveLength(1);
    } finally {
      await second.kill();
    }
  });
});
