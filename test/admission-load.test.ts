// Admission under load: 200 messages submitted at once into 50 conversations of two agents,
// with ceilings low enough to bind: 3 root runs per agent and 5 per install with 8 workers,
// where every start takes the admission lock exclusively; and 10 and 12 with 16 workers, where
// starts far from a ceiling run side by side on start slots and those near it count exactly. The proof
// is read back from the ledger afterwards: every claim and every settle is a run event stamped
// with the statement's own clock, so the intervals in which each run held a worker can be laid
// side by side per conversation, per agent and for the install.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, WaitReason } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { LIVE_SQL } from "../control-plane/src/ledger/run-start.sql.js";
import { raw, sql as sqlText } from "../control-plane/src/ledger/sql.js";
import { connectClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn } from "../control-plane/src/fixtures/scripted-model.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const CONVERSATIONS = 50;
const PER_CONVERSATION = 4;

function busyAgent(id: string, ceiling: number): AgentSpec {
  // Each run takes a little while, so runs overlap and the ceilings bind.
  const primary = scriptedModel([scriptedTurn("answered: {{message}}", [], { delayMs: 25 })]);
  // Every follow-up is its own request: 200 messages, 200 runs, each of which must start exactly once.
  const fast = scriptedModel([scriptedTurn("independent")]);
  return { ...DEMO_AGENT, id, models: { primary, fast, decision: fast }, maxConcurrentRootRuns: ceiling };
}

interface Interval {
  readonly runId: string;
  readonly agentId: string;
  readonly conversationId: string;
  readonly start: number;
  readonly end: number;
}

/** The most intervals open at one instant; an end and a start at the same instant do not overlap. */
function maxOverlap(intervals: readonly Interval[]): number {
  const edges = intervals.flatMap((i) => [
    { at: i.start, delta: 1 },
    { at: i.end, delta: -1 },
  ]);
  edges.sort((a, b) => a.at - b.at || a.delta - b.delta);
  let open = 0;
  let most = 0;
  for (const edge of edges) {
    open += edge.delta;
    most = Math.max(most, open);
  }
  return most;
}

describe.each([
  // Tight ceilings keep runs waiting long enough for the watcher to see why.
  { AGENT_CEILING: 3, INSTALL_CEILING: 5, workers: 8, reasons: [WaitReason.CONVERSATION_BUSY, WaitReason.CONCURRENCY_CEILING] },
  { AGENT_CEILING: 10, INSTALL_CEILING: 12, workers: 16, reasons: [WaitReason.CONVERSATION_BUSY] },
])("admission under load, ceilings $AGENT_CEILING per agent and $INSTALL_CEILING per install, $workers workers", ({ AGENT_CEILING, INSTALL_CEILING, workers, reasons }) => {
  let keel: TestKeel;

  beforeAll(async () => {
    keel = await startTestKeel({
      agents: [busyAgent("busy-a", AGENT_CEILING), busyAgent("busy-b", AGENT_CEILING)],
      workers,
      env: { KEEL_MAX_CONCURRENT_ROOT_RUNS: String(INSTALL_CEILING), KEEL_DB_POOL_MAX: "30", KEEL_IDLE_POLL_MS: "200" },
    });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  it("never runs two root runs of one conversation at once, never exceeds a ceiling, and drops nothing", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const submissions = Array.from({ length: CONVERSATIONS * PER_CONVERSATION }, (_, i) => {
      const conversation = i % CONVERSATIONS;
      return {
        agentId: conversation % 2 === 0 ? "busy-a" : "busy-b",
        conversationId: `load-${conversation}`,
        actor: { id: `actor-${i % 7}` },
        messageId: `load-message-${i}`,
        text: `message ${i}`,
        connector: "load",
      };
    });

    // While it runs, watch what queued runs say about themselves.
    const seenReasons = new Set<WaitReason>();
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const { runs: queued } = await runs.listRuns({ status: RunStatus.QUEUED, pageSize: 500 });
        for (const run of queued) {
          seenReasons.add(run.waitReason);
          if (run.waitReason === WaitReason.CONVERSATION_BUSY || run.waitReason === WaitReason.CONCURRENCY_CEILING) {
            expect(run.queuePosition).toBeGreaterThanOrEqual(1);
          }
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();

    const admitted = await Promise.all(submissions.map((message) => ingress.submitMessage(message)));
    expect(admitted.every((a) => !a.duplicate)).toBe(true);
    const runIds = [...new Set(admitted.map((a) => a.runId))];

    const deadline = Date.now() + 120_000;
    for (;;) {
      const [open] = await keel.app.ledger.sql.query<{ n: number }>(sqlText`SELECT count(*)::int AS n FROM runs WHERE status IN (${raw(LIVE_SQL)})`);
      if (open?.n === 0) break;
      if (Date.now() > deadline) throw new Error(`${open?.n} runs still open`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    watching = false;
    await watcher;

    // Nothing dropped: every message is a trigger of a run that answered it.
    const sql = keel.app.ledger.sql;
    const [counts] = await sql.query<{ messages: number; triggered: number; runs: number; succeeded: number }>(
      sqlText`SELECT (SELECT count(*)::int FROM messages) AS messages,
         (SELECT count(DISTINCT message_id)::int FROM run_triggers) AS triggered,
         (SELECT count(*)::int FROM runs) AS runs,
         (SELECT count(*)::int FROM runs WHERE status = 'succeeded') AS succeeded`,
    );
    expect(counts).toEqual({ messages: 200, triggered: 200, runs: runIds.length, succeeded: runIds.length });
    expect(runIds).toHaveLength(200);

    // Each run's time holding a worker, from the ledger's own events.
    const intervals = (
      // Microseconds since the epoch: the events' own precision.
      await sql.query<{ run_id: string; agent_id: string; conversation_id: string; start_us: string; end_us: string }>(
        sqlText`SELECT r.id AS run_id, r.agent_id, r.conversation_id,
           (SELECT (extract(epoch FROM min(e.at)) * 1000000)::bigint FROM run_events e
            WHERE e.run_id = r.id AND e.kind = 'status_changed' AND e.status = 'running') AS start_us,
           (SELECT (extract(epoch FROM max(e.at)) * 1000000)::bigint FROM run_events e
            WHERE e.run_id = r.id AND e.kind = 'status_changed' AND e.status = 'succeeded') AS end_us
         FROM runs r`,
      )
    ).map((row): Interval => ({
      runId: row.run_id,
      agentId: row.agent_id,
      conversationId: row.conversation_id,
      start: Number(row.start_us),
      end: Number(row.end_us),
    }));
    expect(intervals).toHaveLength(200);
    expect(intervals.every((i) => i.end > i.start)).toBe(true);

    // At most one root run in flight per (agent, conversation).
    const byConversation = new Map<string, Interval[]>();
    for (const interval of intervals) byConversation.set(interval.conversationId, [...(byConversation.get(interval.conversationId) ?? []), interval]);
    expect(byConversation.size).toBe(CONVERSATIONS);
    for (const list of byConversation.values()) {
      expect(list).toHaveLength(PER_CONVERSATION);
      expect(maxOverlap(list)).toBe(1);
    }
    // Neither ceiling was ever exceeded, and both were reached.
    for (const agentId of ["busy-a", "busy-b"]) {
      expect(maxOverlap(intervals.filter((i) => i.agentId === agentId))).toBeLessThanOrEqual(AGENT_CEILING);
    }
    const installPeak = maxOverlap(intervals);
    expect(installPeak).toBeLessThanOrEqual(INSTALL_CEILING);
    expect(installPeak).toBeGreaterThanOrEqual(AGENT_CEILING);
    // Queued runs said why they waited.
    expect([...seenReasons]).toEqual(expect.arrayContaining(reasons));
  });
});
