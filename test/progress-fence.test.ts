// The ledger side of progress notices against a real PostgreSQL: a notice is reserved only by the
// claim that holds a live run nobody asked to stop, once per (subject, sequence), with its emission
// and its copy kept in progress_events; what the supervisor reads back (the subject across
// continuations, the checkpoints and the first workspace not yet said, the running tool).
import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { createProgressRepository } from "../control-plane/src/ledger/progress.repository.js";
import { createSqlPool, type SqlPool } from "../control-plane/src/ledger/sql.js";
import { progressKey } from "../control-plane/src/domain/progress.js";
import type { NoticeReservation, ProgressLedger } from "../control-plane/src/progress/progress-supervisor.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

let keel: TestKeel;
let db: pg.Client;
let pool: SqlPool;
let ledger: ProgressLedger;

beforeAll(async () => {
  // No workers: the test plays the claim itself.
  keel = await startTestKeel({ workers: 0 });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
  pool = createSqlPool({ url: keel.databaseUrl, max: 2 });
  ledger = createProgressRepository(pool);
});

afterAll(async () => {
  await pool?.close();
  await db?.end();
  await keel?.stop();
});

/** A run held by `owner` at `epoch`, as a claim leaves it. */
async function claimedRun(name: string, owner = "w1", epoch = 1): Promise<string> {
  const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
  const { runId } = await ingress.submitMessage({
    agentId: "demo",
    conversationId: `c-${name}`,
    actor: { id: "alice" },
    messageId: `m-${name}`,
    text: "a long task",
    connector: "conn-fence",
  });
  await db.query("UPDATE runs SET status = 'running', lease_owner = $2, lease_epoch = $3, started_at = now() WHERE id = $1", [runId, owner, epoch]);
  return runId;
}

function notice(runId: string, seq: number, extra: Partial<NoticeReservation> = {}): NoticeReservation {
  return {
    runId,
    epoch: 1,
    workerId: "w1",
    subject: runId,
    seq,
    source: "deadline",
    covers: [],
    text: `notice ${seq}`,
    at: new Date("2026-12-01T10:00:00Z"),
    idempotencyKey: progressKey(runId, seq),
    replyToMessageId: undefined,
    addressedActorIds: ["alice"],
    ...extra,
  };
}

describe("reserving a notice", () => {
  it("keeps the copy with its emission, once per (subject, sequence), seen through Subscribe", async () => {
    const runId = await claimedRun("once");
    expect(await ledger.reserve(notice(runId, 1, { source: "checkpoint", covers: ["x"], text: "Plan: read it", replyToMessageId: "m-once" }))).toBe(true);
    // The same sequence again, by a second supervisor of the same claim: nothing.
    expect(await ledger.reserve(notice(runId, 1, { text: "again" }))).toBe(false);
    const { rows } = await db.query<{ text: string; source: string; covers: string[]; kind: string; key: string; delivery_status: string; created_at: Date }>(
      `SELECT pe.text, pe.source, pe.covers, e.kind, e.idempotency_key AS key, e.delivery_status, pe.created_at
       FROM progress_events pe JOIN emissions e ON e.id = pe.emission_id WHERE pe.run_id = $1`,
      [runId],
    );
    expect(rows).toEqual([
      {
        text: "Plan: read it",
        source: "checkpoint",
        covers: ["x"],
        kind: "progress",
        key: `progress:${runId}:1`,
        delivery_status: "pending",
        created_at: new Date("2026-12-01T10:00:00Z"),
      },
    ]);
    const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 15_000);
    let seen: Emission | undefined;
    try {
      for await (const { emission } of emissions.subscribe({ connector: "conn-fence" }, { signal: abort.signal })) {
        if (emission?.kind === EmissionKind.PROGRESS && emission.runId === runId) {
          seen = emission;
          break;
        }
      }
    } finally {
      clearTimeout(timer);
      abort.abort();
    }
    expect(seen).toMatchObject({ text: "Plan: read it", idempotencyKey: `progress:${runId}:1`, replyToMessageId: "m-once", addressedActorIds: ["alice"] });
  });

  it("refuses stale attempts: another claim, a lost lease, a cancellation, a supersession, a settled run", async () => {
    const runId = await claimedRun("stale");
    expect(await ledger.reserve(notice(runId, 1, { epoch: 0 }))).toBe(false);
    expect(await ledger.reserve(notice(runId, 1, { workerId: "w0" }))).toBe(false);
    // Taken over: the old claim cannot send, the new one continues the sequence.
    await db.query("UPDATE runs SET lease_owner = 'w2', lease_epoch = 2 WHERE id = $1", [runId]);
    expect(await ledger.reserve(notice(runId, 1))).toBe(false);
    expect(await ledger.reserve(notice(runId, 1, { epoch: 2, workerId: "w2" }))).toBe(true);
    const held = { epoch: 2, workerId: "w2" };
    await db.query("UPDATE runs SET cancel_requested_by_actor_id = 'alice' WHERE id = $1", [runId]);
    expect(await ledger.reserve(notice(runId, 2, held))).toBe(false);
    await db.query("UPDATE runs SET cancel_requested_by_actor_id = NULL, superseded_by_run_id = id WHERE id = $1", [runId]);
    expect(await ledger.reserve(notice(runId, 2, held))).toBe(false);
    await db.query("UPDATE runs SET superseded_by_run_id = NULL, status = 'succeeded' WHERE id = $1", [runId]);
    expect(await ledger.reserve(notice(runId, 2, held))).toBe(false);
    const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM emissions WHERE run_id = $1 AND kind = 'progress'", [runId]);
    expect(rows[0]?.n).toBe(1);
  });
});

describe("what the supervisor reads", () => {
  it("the checkpoints and the first workspace not yet said, the running tool, and the last notice", async () => {
    const runId = await claimedRun("read");
    const stepId = randomUUID();
    await db.query(
      `INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at)
       VALUES ($1, $2, 0, 'replayable', 'running', 1, '2026-12-01T10:00:00Z')`,
      [stepId, runId],
    );
    const invocation = async (ordinal: number, tool: string, args: unknown, status: string) => {
      const id = randomUUID();
      await db.query(
        `INSERT INTO tool_invocations (id, run_id, step_id, provider_call_id, ordinal, tool_name, tool_version, effect, arguments, status)
         VALUES ($1, $2, $3, $4, $5, $6, '1', 'read', $7, $8)`,
        [id, runId, stepId, `call_${ordinal}`, ordinal, tool, JSON.stringify(args), status],
      );
      return id;
    };
    const plan = await invocation(0, "keel.report_progress.v1", { kind: "plan", text: "check the logs" }, "succeeded");
    await invocation(1, "sandbox.exec.v1", { command: ["npm", "test"] }, "pending");
    const first = await ledger.load(runId);
    expect(first).toMatchObject({
      subject: runId,
      lastSeq: 0,
      lastNoticeAt: undefined,
      candidates: [{ ref: plan, kind: "plan", text: "check the logs" }],
      activity: { kind: "tool", toolName: "sandbox.exec.v1", detail: "npm test", since: new Date("2026-12-01T10:00:00Z") },
    });

    await db.query("INSERT INTO sandbox_hosts (id, capacity, labels, backends, images) VALUES ('h-read', '{}', '{}', '[]', '[]') ON CONFLICT DO NOTHING");
    const workspace = () => db.query("INSERT INTO workspaces (id, host_id, run_id, image, status) VALUES ($1, 'h-read', $2, 'img', 'active')", [randomUUID(), runId]);
    await workspace();
    expect((await ledger.load(runId))?.candidates.map((c) => c.ref)).toEqual(["workspace", plan]);
    expect(await ledger.reserve(notice(runId, 1, { source: "checkpoint", covers: ["workspace", plan] }))).toBe(true);
    // Said once: a second acquisition adds nothing.
    await workspace();
    const after = await ledger.load(runId);
    expect(after).toMatchObject({ lastSeq: 1, lastNoticeAt: new Date("2026-12-01T10:00:00Z"), candidates: [] });
  });

  it("a continuation keeps the cadence of the request it continues", async () => {
    const first = await claimedRun("chain-1");
    const second = await claimedRun("chain-2");
    await db.query("UPDATE runs SET continuation_of_run_id = $2 WHERE id = $1", [second, first]);
    expect(await ledger.reserve(notice(first, 1))).toBe(true);
    expect(await ledger.load(second)).toMatchObject({ subject: first, lastSeq: 1 });
  });
});
