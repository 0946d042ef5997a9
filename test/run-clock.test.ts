// Runs that Keel queues itself (a work graph's children, a fork) are due on Keel's clock, the one
// claims decide on, not the database's. A Keel whose clock is years behind the database's (a held
// test clock here; a skewed host in production) still starts them at once: taking the database's
// now() made each look like a run still coalescing, and no claim ever took it.
// Real PostgreSQL, real workers, gRPC clients.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { DEFAULT_GRAPH_CEILINGS, type AgentSpec } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { ManualClock } from "./support/manual-clock.js";
import { answeringGraphChildren, graphRootAgent, NODE_SLICE } from "./support/graph-children.js";

/** Years before any database this runs against: every now() the database takes is later. */
const KEEL_TIME = new Date("2001-02-03T04:05:06.789Z");
const clock = new ManualClock(KEEL_TIME);

const PROPOSE = "keel.propose_work_graph.v1";
const GRAPH = {
  nodes: [
    { key: "a", kind: "agent_loop", objective: "Work out part a", budget: NODE_SLICE },
    { key: "b", kind: "agent_loop", objective: "Work out part b", budget: NODE_SLICE },
    { key: "merge", kind: "join", objective: "Combine the parts" },
  ],
  edges: [
    { from: "a", to: "merge" },
    { from: "b", to: "merge" },
  ],
};
/** No coalescing window: a message's run is due at once on the held clock, as the runs under test should be. */
const now = (agent: AgentSpec): AgentSpec => ({ ...agent, interrupt: { ...agent.interrupt, coalesceWindowMs: 0 } });
const graphBase = scriptedAgent("clock-graph", [turn("", [toolCall(PROPOSE, GRAPH)]), turn("both parts done")]);
const graphAgent = now(graphRootAgent(graphBase, { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 4, maxParallelism: 2 }));
const replyAgent = now(scriptedAgent("clock-reply", [turn("hello from the source")]));

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  // One worker: it is busy with the root when the children start, so they are queued and claimed
  // by the start rule rather than handed to an idle worker.
  keel = await startTestKeel({ workers: 1, agents: [graphAgent, replyAgent], clock, wrapRunnerDeps: answeringGraphChildren((key) => `result of ${key}`), env: { KEEL_IDLE_POLL_MS: "200" } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);

/** The run's status once it ends; fails with what it is still doing after 20 s. */
async function settled(runId: string): Promise<string> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const { run } = await runs().getRun({ runId });
    const status = run?.status ?? RunStatus.UNSPECIFIED;
    if ([RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(status)) return RunStatus[status];
    if (Date.now() > deadline) {
      const { rows } = await db.query("SELECT id, status, not_before FROM runs WHERE id = $1 OR root_run_id = $1 ORDER BY created_at", [runId]);
      throw new Error(`run ${runId} did not settle in 20 s; runs: ${JSON.stringify(rows)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function submit(agentId: string, conversationId: string): Promise<string> {
  const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
  const { runId } = await ingress.submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId: `m-${conversationId}`, text: "go", connector: "clock-test" });
  return runId;
}

describe("runs Keel queues itself are due on Keel's clock", () => {
  it("starts a work graph's queued children and wakes the root on a clock behind the database's", async () => {
    const rootId = await submit(graphAgent.id, "graph");
    expect(await settled(rootId)).toBe("SUCCEEDED");
    expect((await runs().getRun({ runId: rootId })).run?.finalReply).toBe("both parts done");

    const { rows: children } = await db.query<{ status: string; not_before: Date; claimed_by_rule: boolean }>(
      `SELECT r.status, r.not_before,
         EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = r.id AND e.summary ~ '^claimed by worker-\\S+ at epoch 1$') AS claimed_by_rule
       FROM runs r WHERE r.parent_run_id = $1`,
      [rootId],
    );
    expect(children).toHaveLength(2);
    for (const child of children) {
      expect(child.status).toBe("succeeded");
      expect(child.not_before.toISOString()).toBe(KEEL_TIME.toISOString());
    }
    // At least one child went through a claim (no idle worker to hand it to), the path the clock decides.
    expect(children.some((child) => child.claimed_by_rule)).toBe(true);
  });

  it("starts a fork on a clock behind the database's", async () => {
    const sourceId = await submit(replyAgent.id, "fork-source");
    expect(await settled(sourceId)).toBe("SUCCEEDED");
    const { run: fork } = await runs().forkRun({ runId: sourceId, stepIndex: 0, actor: { id: "op-fred" }, reason: "again, on a slow clock" });
    expect(fork?.id).toBeDefined();
    expect(await settled(fork!.id)).toBe("SUCCEEDED");
    const { rows } = await db.query<{ not_before: Date }>("SELECT not_before FROM runs WHERE id = $1", [fork!.id]);
    expect(rows[0]?.not_before.toISOString()).toBe(KEEL_TIME.toISOString());
  });
});
