// Progress delivery across SIGKILLs of a real `keel serve` child. A notice is dispatched when a
// Subscribe stream hands it out, so the test kills the control plane (1) after a notice's
// reservation committed while no subscriber was connected, and (2) after a stream handed a notice
// to the connector and before the connector acknowledged it. Whatever the interleaving: a
// connector that follows the rules (resume from its cursor, deliver only PENDING emissions) sends
// each notice once, the notice it acknowledged AMBIGUOUS stays so, and the run ends with one reply.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { AckState, DeliveryStatus, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { agentSpecToProto } from "../control-plane/src/api/agent-spec-convert.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn as turn } from "../control-plane/src/fixtures/scripted-model.js";
import { killAllChildren, startKeelServe, waitFor, type ServerProcess } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { createTestDatabase } from "./support/keel-fixture.js";

const CONNECTOR = "kill-progress";
/** Long enough that every phase (a restart, a reclaim, a notice) fits inside one model call on a loaded box. */
const MODEL_DELAY_MS = 12_000;
const LEASE_MS = 1_000;

const agent: AgentSpec = {
  ...DEMO_AGENT,
  id: "kill-progress",
  models: {
    primary: scriptedModel([turn("Finished: {{message}}", [], { delayMs: MODEL_DELAY_MS })]),
    fast: scriptedModel([turn(JSON.stringify({ duration: "default", shape: "loop", ack_text: null }), [], { inputTokens: 1, outputTokens: 1 })]),
    decision: scriptedModel([turn("unclear")]),
  },
  // Through AgentService (proto field 14): a notice after 300 ms of silence, then every 1.5 s.
  progress: { firstAfterMs: 300, everyMs: 1_500, minGapMs: 100 },
};

const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  await killAllChildren();
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

function startKeel(databaseUrl: string, dataDir: string): Promise<ServerProcess> {
  return startKeelServe(["--dev"], {
    DATABASE_URL: databaseUrl,
    KEEL_DATA_DIR: dataDir,
    KEEL_WORKERS: "1",
    KEEL_LEASE_MS: String(LEASE_MS),
    KEEL_IDLE_POLL_MS: "200",
    KEEL_DB_POOL_MAX: "5",
    KEEL_LOG_LEVEL: "info",
  });
}

const isProgressOf = (runId: string) => (e: Emission) => e.kind === EmissionKind.PROGRESS && e.runId === runId;
const isSettledAckOf = (runId: string) => (e: Emission) =>
  e.runId === runId && e.kind === EmissionKind.ACK && (e.ackState === AckState.SUCCEEDED || e.ackState === AckState.FAILED);

/** A connector's memory: what each Subscribe session handed it, and what it delivered onwards. */
interface ConnectorLog {
  /** Every emission a stream handed out, over every session resumed from the cursor. */
  readonly seen: Emission[];
  /** Emissions it acted on (PENDING ones): what a user would see. */
  readonly sent: Emission[];
  cursor: bigint;
}

interface SessionPlan {
  /** A PENDING emission the connector sends but does not acknowledge yet: the session ends there. */
  readonly hold?: (e: Emission) => boolean;
  /** Once seen, read on for a quiet second (would a duplicate follow?), then end. */
  readonly until?: (e: Emission) => boolean;
}

/**
 * One Subscribe session from the log's cursor. The connector delivers (and acknowledges
 * DELIVERED) only PENDING emissions, as docs/clients.md asks; settled ones are skipped.
 */
async function session(url: string, token: string, log: ConnectorLog, plan: SessionPlan): Promise<Emission | undefined> {
  const emissions = connectClient(EmissionService, url, token);
  const stop = new AbortController();
  const deadline = setTimeout(() => stop.abort(), 90_000);
  let quiet: NodeJS.Timeout | undefined;
  try {
    for await (const { emission } of emissions.subscribe({ connector: CONNECTOR, afterSeq: log.cursor }, { signal: stop.signal })) {
      if (emission === undefined) continue;
      log.seen.push(emission);
      log.cursor = emission.seq;
      if (quiet === undefined && plan.until?.(emission) === true) quiet = setTimeout(() => stop.abort(), 1_000);
      if (emission.deliveryStatus !== DeliveryStatus.PENDING) continue;
      log.sent.push(emission);
      if (quiet === undefined && plan.hold?.(emission) === true) return emission;
      await emissions.acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED, remoteRef: "kill-test" });
    }
  } catch (error) {
    if (!stop.signal.aborted) throw error;
  } finally {
    clearTimeout(deadline);
    clearTimeout(quiet);
    stop.abort();
  }
  if (quiet === undefined) throw new Error("the session ended before it saw what it waited for");
  return undefined;
}

describe("progress notices across SIGKILLs of the control plane", () => {
  it("sends no notice twice, keeps the ambiguous one, and finishes the run with one reply", async () => {
    const databaseUrl = await createTestDatabase();
    const dataDir = await mkdtemp(path.join(tmpdir(), "keel-progress-kill-"));
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    cleanups.push(async () => {
      await db.end();
      await rm(dataDir, { recursive: true, force: true });
    });
    const progressRows = async (runId: string) =>
      (
        await db.query<{ seq: number; idempotency_key: string; delivery_status: string }>(
          `SELECT pe.seq, e.idempotency_key, e.delivery_status FROM progress_events pe JOIN emissions e ON e.id = pe.emission_id
           WHERE pe.run_id = $1 ORDER BY pe.seq`,
          [runId],
        )
      ).rows;

    // 1. Reserved, never dispatched: no stream is open when the first notice commits.
    const first = await startKeel(databaseUrl, dataDir);
    const token = (await readFile(path.join(dataDir, "dev-token"), "utf8")).trim();
    await connectClient(AgentService, first.url, token).putAgent({ agent: agentSpecToProto(agent) });
    const stored = await connectClient(AgentService, first.url, token).getAgent({ agentId: agent.id });
    expect(stored.agent?.progress).toMatchObject({ firstAfterMs: 300, everyMs: 1_500, minGapMs: 100 });
    const { runId } = await connectClient(IngressService, first.url, token).submitMessage({
      agentId: agent.id,
      conversationId: "kill-1",
      actor: { id: "alice" },
      messageId: "m1",
      text: "a long one",
      connector: CONNECTOR,
    });
    const reservedUndispatched = await waitFor("a notice reservation to commit", async () => {
      const rows = await progressRows(runId);
      return rows.length > 0 ? rows : undefined;
    });
    await first.kill();
    expect(first.process.signalCode).toBe("SIGKILL");
    const beforeRestart = await progressRows(runId);
    expect(beforeRestart.length).toBeGreaterThanOrEqual(reservedUndispatched.length);
    expect(beforeRestart.every((row) => row.delivery_status === "pending")).toBe(true);
    const undispatched = new Set(beforeRestart.map((row) => row.idempotency_key));

    // 2. Dispatched, not acknowledged: the stream hands a new notice over and the process dies.
    const log: ConnectorLog = { seen: [], sent: [], cursor: 0n };
    const second = await startKeel(databaseUrl, dataDir);
    const held = await session(second.url, token, log, { hold: (e) => isProgressOf(runId)(e) && !undispatched.has(e.idempotencyKey) });
    expect(held).toBeDefined();
    await second.kill();
    expect(second.process.signalCode).toBe("SIGKILL");
    const heldId = held?.id ?? "";

    // 3. Restarted: the connector reports that its send of the held notice timed out, then resumes from its cursor.
    const third = await startKeel(databaseUrl, dataDir);
    const emissions = connectClient(EmissionService, third.url, token);
    const acked = await emissions.acknowledgeEmission({ emissionId: heldId, outcome: DeliveryStatus.AMBIGUOUS, detail: "timed out after sending" });
    expect(acked.emission?.deliveryStatus).toBe(DeliveryStatus.AMBIGUOUS);
    await session(third.url, token, log, { until: isSettledAckOf(runId) });

    const progressSeen = log.seen.filter(isProgressOf(runId));
    const progressSent = log.sent.filter(isProgressOf(runId));
    const counts = (list: Emission[]) => list.reduce((m, e) => m.set(e.idempotencyKey, (m.get(e.idempotencyKey) ?? 0) + 1), new Map<string, number>());
    expect(progressSeen.length).toBeGreaterThanOrEqual(undispatched.size + 1);
    // Each notice handed out once over the whole test, and delivered once: per (request, sequence).
    expect([...counts(progressSeen).values()].every((n) => n === 1)).toBe(true);
    expect([...counts(progressSent).values()].every((n) => n === 1)).toBe(true);
    for (const key of undispatched) expect(counts(progressSent).get(key)).toBe(1);
    expect(progressSeen.every((e) => e.idempotencyKey.startsWith("progress:"))).toBe(true);
    // The held notice is the one sent while the stream was cut, and it was sent exactly once.
    expect(progressSent.filter((e) => e.id === heldId)).toHaveLength(1);

    // One reply, after every notice; the run succeeded.
    const replies = log.seen.filter((e) => e.kind === EmissionKind.REPLY && e.runId === runId);
    expect(replies.map((e) => e.text)).toEqual(["Finished: a long one"]);
    const replySeq = replies[0]?.seq ?? 0n;
    expect(progressSeen.every((e) => e.seq < replySeq)).toBe(true);
    const { rows: ledger } = await db.query<{ status: string; replies: number; epoch: string }>(
      "SELECT r.status, r.lease_epoch AS epoch, (SELECT count(*)::int FROM emissions e WHERE e.run_id = r.id AND e.kind = 'reply') AS replies FROM runs r WHERE r.id = $1",
      [runId],
    );
    expect(ledger[0]).toMatchObject({ status: "succeeded", replies: 1 });
    expect(Number(ledger[0]?.epoch)).toBeGreaterThanOrEqual(3);

    // The ambiguous one stays so: the ledger keeps it, a second acknowledgement cannot reopen it,
    // and a rewind to zero offers nothing to deliver again.
    const rows = await progressRows(runId);
    expect(rows.map((row) => row.seq)).toEqual(rows.map((_, i) => i + 1));
    expect(rows.filter((row) => row.delivery_status === "ambiguous").map((row) => row.idempotency_key)).toEqual([held?.idempotencyKey]);
    expect(rows.every((row) => row.delivery_status !== "pending")).toBe(true);
    const again = await emissions.acknowledgeEmission({ emissionId: heldId, outcome: DeliveryStatus.DELIVERED });
    expect(again.emission?.deliveryStatus).toBe(DeliveryStatus.AMBIGUOUS);
    const rewound: ConnectorLog = { seen: [], sent: [], cursor: 0n };
    await session(third.url, token, rewound, { until: isSettledAckOf(runId) });
    expect(rewound.seen.filter(isProgressOf(runId))).toHaveLength(progressSeen.length);
    expect(rewound.seen.find((e) => e.id === heldId)?.deliveryStatus).toBe(DeliveryStatus.AMBIGUOUS);
    expect(rewound.sent.filter((e) => e.runId === runId)).toEqual([]);
    await third.kill();
  }, 240_000);
});
