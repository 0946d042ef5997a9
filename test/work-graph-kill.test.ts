// SIGKILL through a WorkGraph (issue #14 item 8): a Keel process (test/support/fault-serve.ts)
// kills itself once per run at one point, three ways:
//   after_model_call   a model call answered, its step not committed: the root before it proposes,
//                      each child in its first turn (mid-child);
//   after_graph_admitted  the root right after its graph was admitted and it parked, before the
//                      tool returned;
//   after_settle       each child right after its settle committed, its node not yet settled
//                      (between the join's inputs), and the root after its reply.
// Restarted each time, Keel must finish the graph from the ledger: one proposal admitted, one
// child run per branch (no branch started twice), the join done, and exactly one reply.
import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { killAllChildren, prepareLedger, sleep, startFaultServe, type ServerProcess } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { createTestDatabase } from "./support/keel-fixture.js";
import { graphRootAgent } from "./support/graph-children.js";

const SLICE = { wall_clock_ms: 120_000, iterations: 3, model_calls: 3, tool_calls: 1, input_tokens: 50_000, output_tokens: 5_000, output_bytes: 100_000, cost_micro_usd: 10 };
const PROPOSAL = {
  nodes: [
    { key: "a", kind: "agent_loop", objective: "Do part a", budget: SLICE },
    { key: "b", kind: "agent_loop", objective: "Do part b", budget: SLICE },
    { key: "c", kind: "agent_loop", objective: "Do part c", budget: SLICE },
    { key: "all", kind: "join", objective: "Put the parts together" },
  ],
  edges: ["a", "b", "c"].map((from) => ({ from, to: "all" })),
};
const FINAL = "All parts are done.";
// A child plays the same script: its first turn asks for the propose tool, which it is not offered
// (refused, the turn is invalid), and its second replies. The root's turn after the graph is its last.
const base = scriptedAgent("graph-kill", [turn("", [toolCall("keel.propose_work_graph.v1", PROPOSAL)]), turn(FINAL)]);
const agent = graphRootAgent(base);

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "budget_exhausted"]);
const cleanups: (() => Promise<void>)[] = [];

afterAll(async () => {
  await killAllChildren();
  for (const cleanup of cleanups.reverse()) await cleanup();
});

describe("SIGKILL through a work graph (issue 14)", () => {
  it.each([
    // Every run once: the root and the three children.
    { fault: "after_model_call", faults: [4, 4], graceMs: "250" },
    { fault: "after_graph_admitted", faults: [1, 1], graceMs: "0" },
    // At once, before anything else in the process reacts to the settle. A run whose settle
    // commits as another run's kill lands is settled without reaching its own point.
    { fault: "after_settle", faults: [1, 4], graceMs: "0" },
  ])("$fault: finishes the graph after every kill, starting no branch twice, with one reply", async ({ fault, faults, graceMs }) => {
    const databaseUrl = await createTestDatabase();
    const dir = await mkdtemp(path.join(tmpdir(), "keel-graph-kill-"));
    const faultDir = path.join(dir, "faults");
    await mkdir(path.join(dir, "effects"), { recursive: true });
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    cleanups.push(async () => {
      await db.end().catch(() => {});
      await rm(dir, { recursive: true, force: true });
    });
    const token = await prepareLedger(databaseUrl, [agent]);
    const env = {
      DATABASE_URL: databaseUrl,
      KEEL_EFFECTS_DIR: path.join(dir, "effects"),
      KEEL_FAULT: fault,
      KEEL_FAULT_DIR: faultDir,
      KEEL_TEST_AGENTS: JSON.stringify([agent]),
      KEEL_LEASE_MS: "1000",
      KEEL_IDLE_POLL_MS: "200",
      KEEL_WORKERS: "4",
      KEEL_DB_POOL_MAX: "6",
      KEEL_LOG_LEVEL: "warn",
      KEEL_FAULT_GRACE_MS: graceMs,
    };
    let server: ServerProcess | undefined;
    let starts = 0;
    const ensure = async (): Promise<ServerProcess> => {
      if (server?.alive()) return server;
      if (server !== undefined) expect(server.process.signalCode, server.output.join("\n")).toBe("SIGKILL");
      starts += 1;
      if (starts > 12) throw new Error("fault-serve was started 12 times; giving up");
      server = await startFaultServe(env, 200);
      return server;
    };
    cleanups.push(async () => {
      await server?.kill();
    });

    let rootId: string | undefined;
    while (rootId === undefined) {
      const ingress = connectClient(IngressService, (await ensure()).url, token);
      try {
        rootId = (
          await ingress.submitMessage(
            { agentId: agent.id, conversationId: `kill-${fault}`, actor: { id: "alice" }, messageId: `m-kill-${fault}`, text: "Do all parts", connector: "graph-kill" },
            { timeoutMs: 5_000 },
          )
        ).runId;
      } catch {
        // the server died; the same message id is a duplicate on the next one, never a second run
      }
    }
    const deadline = Date.now() + 150_000;
    for (;;) {
      const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [rootId]);
      if (TERMINAL.has(rows[0]?.status ?? "")) break;
      if (Date.now() > deadline) throw new Error(`the root is still ${rows[0]?.status ?? "missing"} after ${starts} starts`);
      await ensure();
      await sleep(100);
    }

    const { rows: root } = await db.query<{ status: string; final_reply: string | null; shape: string }>("SELECT status, final_reply, shape FROM runs WHERE id = $1", [rootId]);
    expect(root[0]).toEqual({ status: "succeeded", final_reply: FINAL, shape: "graph" });
    // Each run that reaches the point was killed there once.
    const killed = (await readdir(faultDir)).filter((f) => f.endsWith(".fault")).length;
    expect(killed).toBeGreaterThanOrEqual(faults[0]!);
    expect(killed).toBeLessThanOrEqual(faults[1]!);
    expect(starts).toBeGreaterThanOrEqual(2);

    const { rows: proposals } = await db.query<{ status: string }>("SELECT status FROM tool_invocations WHERE run_id = $1 AND tool_name = 'keel.propose_work_graph.v1'", [rootId]);
    expect(proposals).toEqual([{ status: "succeeded" }]);
    const { rows: nodes } = await db.query<{ key: string; status: string; attempts: number }>(
      `SELECT n.key, n.status, (SELECT count(*)::int FROM work_node_attempts a WHERE a.node_id = n.id) AS attempts
       FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1 ORDER BY n.ordinal`,
      [rootId],
    );
    expect(nodes).toEqual([
      { key: "a", status: "succeeded", attempts: 1 },
      { key: "b", status: "succeeded", attempts: 1 },
      { key: "c", status: "succeeded", attempts: 1 },
      { key: "all", status: "succeeded", attempts: 0 },
    ]);
    const { rows: children } = await db.query<{ id: string; status: string }>("SELECT id, status FROM runs WHERE parent_run_id = $1", [rootId]);
    expect(children.map((c) => c.status)).toEqual(["succeeded", "succeeded", "succeeded"]);
    const { rows: replies } = await db.query<{ run_id: string }>("SELECT run_id FROM emissions WHERE kind = 'reply' AND run_id = ANY($1::uuid[])", [[rootId, ...children.map((c) => c.id)]]);
    expect(replies).toEqual([{ run_id: rootId }]);
  }, 200_000);
});
