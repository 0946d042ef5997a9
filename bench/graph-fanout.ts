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
import { startBenchKeel, withBenchPostgres } from "./support.js";

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
async function traceLastGraph(db: pg.Client, progress: (line: string) => void): Promise<void> {
  const { rows } = await db.query<{ run: string; ms: number; kind: string; summary: string }>(
    `WITH root AS (SELECT id, created_at FROM runs WHERE agent_id = 'bench-graph' AND parent_run_id IS NULL ORDER BY created_at DESC LIMIT 1)
     SELECT CASE WHEN e.run_id = root.id THEN 'root' ELSE 'child ' || left(e.run_id::text, 4) END AS run,
       round(extract(epoch FROM e.at - root.created_at) * 1000)::int AS ms, e.kind, left(e.summary, 70) AS summary
     FROM root JOIN runs r ON r.id = root.id OR r.parent_run_id = root.id JOIN run_events e ON e.run_id = r.id ORDER BY e.at`,
  );
  for (const row of rows) progress(`${String(row.ms).padStart(6)} ms  ${row.run.padEnd(10)} ${row.kind.padEnd(15)} ${row.summary}`);
}

export interface FanoutFigures {
  readonly graphMs: readonly number[];
  readonly loopMs: readonly number[];
}

/** Runs each shape `rounds` times, alternating, and returns the end-to-end times (submit to settled). */
export async function measureFanout(branches: number, callMs: number, rounds: number, progress: (line: string) => void): Promise<FanoutFigures> {
  // The root parks while its children run: one worker per branch lets all of them run at once.
  process.env["KEEL_WORKERS"] ??= String(branches + 1);
  return withBenchPostgres("graph", progress, async (postgres) => {
    const { graph, loop } = agents(branches, callMs);
    const keel = await startBenchKeel(postgres, graph, "strict", { wrapRunnerDeps: slowChildren(callMs) });
    const db = new pg.Client({ connectionString: postgres.url });
    try {
      await keel.app.agents.put(loop);
      await db.connect();
      const ingress = createClient(
        IngressService,
        createGrpcTransport({ baseUrl: keel.url, interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${keel.token}`), next(req))] }),
      );
      const once = async (agentId: string, round: number): Promise<number> => {
        const started = performance.now();
        const conversationId = `${agentId}-${round}`;
        const { runId } = await ingress.submitMessage({ agentId, conversationId, actor: { id: "bench" }, messageId: `m-${conversationId}`, text: "Do all the parts", connector: "bench" });
        for (;;) {
          const { rows } = await db.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId]);
          const status = rows[0]?.status ?? "";
          if (status === "succeeded") return performance.now() - started;
          if (["failed", "cancelled", "budget_exhausted"].includes(status)) throw new Error(`${agentId} run ${runId} ended ${status}`);
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      };
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
