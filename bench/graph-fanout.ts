// WorkGraph bench part (c): N independent branches whose model calls each take `callMs`, run as a
// graph (keel.propose_work_graph.v1, N child runs, a join, the root's last turn) against the same
// N calls made one after another by a loop, both end to end through Keel on one embedded
// PostgreSQL. The model is scripted; a child's call is recognised by its input and made to take
// `callMs`, as every loop turn does. KEEL_BENCH_TRACE=1 prints the last graph's run events with
// their times, to see where the time beyond the calls goes (mostly one synchronous commit after
// another: the root's step, admission, the children's claims and replies, the pass, the root's
// claim and reply).
import { performance } from "node:perf_hooks";
import pg from "pg";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedModel, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { beginRaw, startBenchKeel, withBenchPostgres, type Durability } from "./support.js";

const CHILD_MARK = /^You are doing one part of a larger task: node "([^"]+)"/;
const QUIET = scriptedModel([turn("")]);

function agents(branches: number, callMs: number): { graph: AgentSpec; loop: AgentSpec } {
  const slice = { wall_clock_ms: 120_000, iterations: 2, model_calls: 2, tool_calls: 1, input_tokens: 50_000, output_tokens: 5_000, output_bytes: 100_000, cost_micro_usd: 10 };
  const keys = Array.from({ length: branches }, (_, i) => `part${i}`);
  const proposal = {
    nodes: [...keys.map((key) => ({ key, kind: "agent_loop", objective: `Work out ${key}`, budget: slice })), { key: "combine", kind: "join", objective: "Combine the parts" }],
    edges: keys.map((key) => ({ from: key, to: "combine" })),
  };
  const graph: AgentSpec = {
    ...DEMO_AGENT,
    id: "bench-graph",
    models: { primary: scriptedModel([turn("", [toolCall("keel.propose_work_graph.v1", proposal)]), turn("combined")]), fast: QUIET, decision: QUIET },
    graph: { maxNodes: branches + 1, maxDepth: 2, maxParallelism: branches, maxRevisions: 0, maxReplans: 1 },
  };
  // The same N calls in one loop: each turn takes callMs and reports a milestone (a quick read).
  const step = turn("", [toolCall("keel.report_progress.v1", { kind: "milestone", text: "a part is done" })], { delayMs: callMs });
  const loop: AgentSpec = {
    ...DEMO_AGENT,
    id: "bench-loop",
    models: { primary: scriptedModel([...keys.map(() => step), turn("combined")]), fast: QUIET, decision: QUIET },
  };
  return { graph, loop };
}

function slowChildren(callMs: number): (deps: RunnerDeps) => RunnerDeps {
  return (deps) => {
    const scripted = deps.providers.scripted;
    const provider: ModelProvider = {
      ...scripted,
      async complete(request) {
        const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content;
        if (input === undefined) return scripted.complete(request);
        await new Promise((resolve) => setTimeout(resolve, callMs));
        return { text: `result of ${CHILD_MARK.exec(input)?.[1] ?? "?"}`, toolCalls: [], usage: { inputTokens: 100, outputTokens: 10 }, finishReason: "stop" };
      },
    };
    return { ...deps, providers: { ...deps.providers, scripted: provider } };
  };
}

/** Where the last graph's time went: its root's and children's events, in ms from the root's creation. */
async function traceLastGraph(db: pg.Client, progress: (line: string) => void, agentId = "bench-graph"): Promise<void> {
  const { rows } = await db.query<{ run: string; ms: string; kind: string; summary: string }>(
    `WITH root AS (SELECT id, created_at FROM runs WHERE agent_id = $1 AND parent_run_id IS NULL ORDER BY created_at DESC LIMIT 1)
     SELECT CASE WHEN e.run_id = root.id THEN 'root' ELSE 'child ' || left(e.run_id::text, 4) END AS run,
       round(extract(epoch FROM e.at - root.created_at) * 1000, 1)::text AS ms, e.kind, left(e.summary, 70) AS summary
     FROM root JOIN runs r ON r.id = root.id OR r.parent_run_id = root.id JOIN run_event_feed e ON e.run_id = r.id ORDER BY e.at`,
    [agentId],
  );
  for (const row of rows) progress(`${row.ms.padStart(8)} ms  ${row.run.padEnd(10)} ${row.kind.padEnd(15)} ${row.summary}`);
}

export interface FanoutFigures {
  readonly graphMs: readonly number[];
  readonly loopMs: readonly number[];
}

/** Runs each shape `rounds` times, alternating, and returns the end-to-end times (submit to settled). */
export async function measureFanout(branches: number, callMs: number, rounds: number, durability: Durability, progress: (line: string) => void): Promise<FanoutFigures> {
  // The root parks while its children run: one worker per branch lets all of them run at once.
  process.env["KEEL_WORKERS"] ??= String(branches + 1);
  return withBenchPostgres("graph", progress, async (postgres) => {
    const { graph, loop } = agents(branches, callMs);
    const keel = await startBenchKeel(postgres, graph, durability, { wrapRunnerDeps: slowChildren(callMs) });
    const db = new pg.Client({ connectionString: postgres.url });
    try {
      await keel.app.agents.put(loop);
      await db.connect();
      const ingress = createClient(
        IngressService,
        createGrpcTransport({ baseUrl: keel.url, interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${keel.token}`), next(req))] }),
      );
      // The end is seen when it commits: the run's events notify keel_run_events, and each
      // notice for the run looks again (a 10 ms poll would add up to 10 ms to either shape).
      await db.query("LISTEN keel_run_events");
      let changed: (() => void) | undefined;
      let watching = "";
      db.on("notification", (notice) => notice.payload === watching && changed?.());
      const once = async (agentId: string, round: number): Promise<number> => {
        const started = performance.now();
        const conversationId = `${agentId}-${round}`;
        const { runId } = await ingress.submitMessage({ agentId, conversationId, actor: { id: "bench" }, messageId: `m-${conversationId}`, text: "Do all the parts", connector: "bench" });
        watching = runId;
        for (;;) {
          const notified = new Promise<void>((resolve) => (changed = resolve));
          const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId]);
          const status = rows[0]?.status ?? "";
          if (status === "succeeded") return performance.now() - started;
          if (["failed", "cancelled", "budget_exhausted"].includes(status)) throw new Error(`${agentId} run ${runId} ended ${status}`);
          await Promise.race([notified, new Promise((resolve) => setTimeout(resolve, 50))]);
        }
      };
      // One unmeasured round of each shape first: the JIT and the pool's prepared statements warm up.
      const warm = { graph: await once(graph.id, -1), loop: await once(loop.id, -1) };
      progress(`warm-up round: graph ${warm.graph.toFixed(0)} ms, loop ${warm.loop.toFixed(0)} ms`);
      const graphMs: number[] = [];
      const loopMs: number[] = [];
      for (let round = 0; round < rounds; round++) {
        graphMs.push(await once(graph.id, round));
        loopMs.push(await once(loop.id, round));
        progress(`round ${round + 1}: graph ${graphMs.at(-1)!.toFixed(0)} ms, loop ${loopMs.at(-1)!.toFixed(0)} ms`);
      }
      if (process.env["KEEL_BENCH_TRACE"] === "1") await traceLastGraph(db, progress);
      return { graphMs, loopMs };
    } finally {
      await db.end().catch(() => undefined);
      await keel.app.stop();
    }
  });
}

export interface ChainFigures {
  /** Per node of a chain: from its child run's creation to the next node's (ready → claimed → settled → next ready). */
  readonly perNodeMs: readonly number[];
  /** One raw transaction writing the rows a node costs the ledger (node, child run, input, attempt, event, settlement). */
  readonly rawMs: readonly number[];
}

/**
 * Part (b): a chain of `length` agent_loop nodes whose calls answer at once, so each node's time
 * is the scheduler's own: the pass that starts it, the claim, the child's reply commit and the
 * pass that readies the next. The baseline writes the same rows in one raw transaction.
 */
export async function measureChain(length: number, samples: number, durability: Durability, progress: (line: string) => void): Promise<ChainFigures> {
  process.env["KEEL_WORKERS"] ??= "2";
  return withBenchPostgres("graph-chain", progress, async (postgres) => {
    // Sized so a chain of up to 45 nodes fits the root's default budget (wall clock adds up along the chain).
    const slice = { wall_clock_ms: 20_000, iterations: 1, model_calls: 1, tool_calls: 1, input_tokens: 20_000, output_tokens: 2_000, output_bytes: 100_000, cost_micro_usd: 10 };
    const keys = Array.from({ length }, (_, i) => `step${i}`);
    const proposal = {
      nodes: keys.map((key) => ({ key, kind: "agent_loop", objective: `Do ${key}`, budget: slice })),
      edges: keys.slice(1).map((key, i) => ({ from: keys[i]!, to: key })),
    };
    const agent: AgentSpec = {
      ...DEMO_AGENT,
      id: "bench-chain",
      models: { primary: scriptedModel([turn("", [toolCall("keel.propose_work_graph.v1", proposal)]), turn("done")]), fast: QUIET, decision: QUIET },
      graph: { maxNodes: length, maxDepth: length, maxParallelism: 1, maxRevisions: 0, maxReplans: 1 },
    };
    const keel = await startBenchKeel(postgres, agent, durability, { wrapRunnerDeps: slowChildren(0) });
    const db = new pg.Client({ connectionString: postgres.url });
    try {
      await db.connect();
      const ingress = createClient(
        IngressService,
        createGrpcTransport({ baseUrl: keel.url, interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${keel.token}`), next(req))] }),
      );
      const chainRun = async (conversationId: string): Promise<string> => {
        const { runId } = await ingress.submitMessage({ agentId: agent.id, conversationId, actor: { id: "bench" }, messageId: `m-${conversationId}`, text: "Do the steps in order", connector: "bench" });
        for (;;) {
          const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId]);
          if (rows[0]?.status === "succeeded") return runId;
          if (["failed", "cancelled", "budget_exhausted"].includes(rows[0]?.status ?? "")) throw new Error(`chain run ended ${rows[0]?.status ?? ""}`);
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      };
      // A control plane runs for days: the measured chain follows one that warms the JIT and each
      // pool connection's prepared statements (PostgreSQL plans a statement afresh for its first
      // five executions on a connection); the baseline's one connection is warm after its first sample.
      const warmStarted = performance.now();
      await chainRun("chain-warm-up");
      progress(`warm-up chain of ${length} nodes: ${(performance.now() - warmStarted).toFixed(0)} ms`);
      const runId = await chainRun("chain");
      // In the ledger's microseconds (a Date would round each to a whole millisecond).
      const { rows: created } = await db.query<{ ms: number }>(
        `SELECT extract(epoch FROM r.created_at) * 1000 AS ms FROM runs r JOIN work_node_attempts a ON a.child_run_id = r.id JOIN work_nodes n ON n.id = a.node_id
         WHERE r.parent_run_id = $1 ORDER BY n.ordinal`,
        [runId],
      );
      // Where a node's time goes, in microseconds from the ledger's own clocks (the created_at above is whole ms).
      const { rows: stages } = await db.query<{ claim: number; step: number; commit: number; finish: number; next: number | null }>(
        `WITH c AS (
           SELECT n.ordinal, r.created_at, r.started_at, r.finished_at,
             (SELECT min(s.started_at) FROM run_steps s WHERE s.run_id = r.id) AS step_at,
             (SELECT max(s.committed_at) FROM run_steps s WHERE s.run_id = r.id) AS commit_at
           FROM runs r JOIN work_node_attempts a ON a.child_run_id = r.id JOIN work_nodes n ON n.id = a.node_id WHERE r.parent_run_id = $1)
         SELECT extract(epoch FROM started_at - created_at) * 1000 AS claim, extract(epoch FROM step_at - started_at) * 1000 AS step,
           extract(epoch FROM commit_at - step_at) * 1000 AS commit, extract(epoch FROM finished_at - commit_at) * 1000 AS finish,
           extract(epoch FROM lead(created_at) OVER (ORDER BY ordinal) - finished_at) * 1000 AS next
         FROM c ORDER BY ordinal`,
        [runId],
      );
      const mid = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
      const stage = (pick: (row: (typeof stages)[number]) => number | null) => mid(stages.map(pick).filter((v): v is number => v !== null).map(Number)).toFixed(1);
      progress(
        `chain stages, median ms per node: created -> claimed ${stage((r) => r.claim)}, claimed -> step started ${stage((r) => r.step)}, ` +
          `step started -> committed ${stage((r) => r.commit)}, committed -> run finished ${stage((r) => r.finish)}, run finished -> next created ${stage((r) => r.next)}`,
      );
      if (process.env["KEEL_BENCH_TRACE"] === "1") await traceLastGraph(db, progress, agent.id);
      const perNodeMs = created.slice(1).map((row, i) => Number(row.ms) - Number(created[i]!.ms));
      const [ids] = (await db.query<{ graph_id: string; agent_id: string; conversation_id: string }>(
        "SELECT g.id AS graph_id, r.agent_id, r.conversation_id FROM work_graphs g JOIN runs r ON r.id = g.root_run_id WHERE g.root_run_id = $1",
        [runId],
      )).rows;
      if (ids === undefined) {
        const { rows: refusals } = await db.query<{ result_text: string }>("SELECT result_text FROM tool_invocations WHERE run_id = $1 ORDER BY created_at", [runId]);
        throw new Error(`the chain's graph is missing; the proposal got: ${refusals.map((r) => r.result_text).join(" | ")}`);
      }
      const rawMs: number[] = [];
      for (let i = 0; i < samples; i++) {
        const started = performance.now();
        await beginRaw(db, durability);
        await db.query(
          `WITH node AS (
             INSERT INTO work_nodes (id, graph_id, key, kind, status, objective, depends_on, ordinal)
             VALUES (gen_random_uuid(), $1, 'raw-' || $4::text, 'agent_loop', 'running', 'raw', '[]'::jsonb, 1000 + $4::int) RETURNING id),
           child AS (
             INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, parent_run_id, root_run_id, event_seq, trigger_count)
             VALUES (gen_random_uuid(), $2, $3, 'bench', 'queued', 'bench', '{}'::jsonb, '{}'::jsonb, $5, $5, 1, 1) RETURNING id),
           message AS (
             INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id)
             SELECT gen_random_uuid(), $3, 'raw-' || $4::text, 'bench', 'raw input', child.id FROM child RETURNING id),
           trigger AS (
             INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id) SELECT child.id, message.id, 'bench', 'raw-' || $4::text FROM child, message),
           attempt AS (
             INSERT INTO work_node_attempts (id, node_id, ordinal, status, replayability, child_run_id)
             SELECT gen_random_uuid(), node.id, 1, 'succeeded', 'replayable', child.id FROM node, child),
           event AS (
             INSERT INTO run_events (run_id, seq, kind, status, summary) SELECT child.id, 1, 'created', 'queued', 'raw' FROM child)
           SELECT child.id FROM child`,
          [ids.graph_id, ids.agent_id, ids.conversation_id, String(i), runId],
        );
        await db.query("UPDATE runs SET status = 'succeeded', final_reply = 'raw', finished_at = now() WHERE root_run_id = $1 AND connector = 'bench' AND status = 'queued'", [runId]);
        await db.query("UPDATE work_nodes SET status = 'succeeded', output = 'raw', finished_at = now() WHERE graph_id = $1 AND key = 'raw-' || $2::text", [ids.graph_id, String(i)]);
        await db.query("COMMIT");
        rawMs.push(performance.now() - started);
      }
      return { perNodeMs, rawMs };
    } finally {
      await db.end().catch(() => undefined);
      await keel.app.stop();
    }
  });
}
