// WorkGraph tests answer their child runs with a wrapped scripted provider: a call whose input
// is a child's ("node X of a work graph", domain/work-graph-child.ts) is answered by the test,
// any other (the root's) by the script or the test's own root rule.
import pg from "pg";
import { DEFAULT_GRAPH_CEILINGS, type AgentSpec, type GraphCeilings } from "../../control-plane/src/domain/agent.js";
import type { ModelTurn } from "../../control-plane/src/domain/transcript.js";
import { scriptedModel, scriptedTurn } from "../../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../../control-plane/src/runner/runner.js";
import { startTestKeel, type TestKeel, type TestKeelOptions } from "./keel-fixture.js";

export const CHILD_MARK = /^You are doing one part of a larger task: node "([^"]+)"/;

/** The budget slice an agent node is proposed with, as the proposal's snake_case JSON: room for a reply or one tool call. */
export const NODE_SLICE = { wall_clock_ms: 120_000, iterations: 2, model_calls: 2, tool_calls: 1, input_tokens: 50_000, output_tokens: 5_000, output_bytes: 100_000, cost_micro_usd: 10 };

/** A fast or decision model that says nothing: no triage and no progress notes get in a test's way. */
const QUIET = scriptedModel([scriptedTurn("")]);

/** `base` as a WorkGraph root under `graph`'s ceilings, its fast and decision models quiet. */
export function graphRootAgent(base: AgentSpec, graph: GraphCeilings = DEFAULT_GRAPH_CEILINGS): AgentSpec {
  return { ...base, models: { primary: base.models.primary, fast: QUIET, decision: QUIET }, graph };
}

/**
 * `child` answers a node's call with a reply, or a whole turn (tool calls included; it sees the
 * request, so it can tell a first call from one after a tool result).
 */
export function answeringGraphChildren(
  child: (key: string, input: string, request: ModelRequest) => string | ModelTurn,
  root?: (request: ModelRequest, scripted: ModelProvider) => Promise<ModelTurn>,
): (deps: RunnerDeps) => RunnerDeps {
  return (deps) => {
    const scripted = deps.providers.scripted;
    const provider: ModelProvider = {
      ...scripted,
      complete(request: ModelRequest) {
        const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content;
        const key = input === undefined ? undefined : CHILD_MARK.exec(input)?.[1];
        if (input === undefined || key === undefined) return root === undefined ? scripted.complete(request) : root(request, scripted);
        const answer = child(key, input, request);
        if (typeof answer !== "string") return Promise.resolve(answer);
        return Promise.resolve({ text: answer, toolCalls: [], usage: { inputTokens: 100, outputTokens: 10 }, finishReason: "stop" as const });
      },
    };
    return { ...deps, providers: { ...deps.providers, scripted: provider } };
  };
}

/** A Keel for a WorkGraph test file and a PostgreSQL client on its database, to read the graph tables. */
export interface GraphKeel {
  readonly keel: TestKeel;
  readonly db: pg.Client;
  stop(): Promise<void>;
}

/** Three workers (a root and its parallel children), a quick idle poll, and the test's answers for the children. */
export async function startGraphKeel(options: Pick<TestKeelOptions, "agents" | "tools" | "wrapRunnerDeps">): Promise<GraphKeel> {
  const keel = await startTestKeel({ workers: 3, ...options, env: { KEEL_IDLE_POLL_MS: "250" } });
  const db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
  return {
    keel,
    db,
    stop: async () => {
      await db.end();
      await keel.stop();
    },
  };
}
