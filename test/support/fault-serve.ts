// A test-only `keel serve`: `node --import tsx test/support/fault-serve.ts`.
//
// Composes Keel the way serve-command.ts does, with the test tools and the agents given in
// KEEL_TEST_AGENTS (JSON AgentSpec[], domain form), and creates nothing else (no tokens, no
// demo agent). Prints `LISTENING <url>` once it serves, then starts the workers.
//
// With KEEL_FAULT=<point> the process SIGKILLs itself at that point, at most once per run:
//   after_model_call   start of commitStep for a step with a model call (answered, nothing committed)
//   after_intent       right after commitStep resolved for a step with pending tool calls
//   during_read        inside test.echo.v1's execute, after it ran, before it returns
//   during_write       inside test.append_line.v1's execute, after its effect line was appended,
//                      before it returns (effect done, result lost)
//   after_tool_result  start of the commit carrying a succeeded/failed result (result known, not committed): a
//                      write's own commitToolOutcome, or the next commit for a read's result held back to ride with it
//   after_graph_admitted  right after keel.propose_work_graph.v1 admitted a graph (committed, root parked),
//                      before the tool returns
//   after_settle       right after a step commit that ends the run resolved (settled and committed, nothing after it
//                      done: a work graph's child is settled while its node is not)
// A marker file per run in KEEL_FAULT_DIR is written synchronously before the kill, so a
// restarted process never kills again for that run.
//
// The run that reaches its point stops there and never moves again. The kill comes at once
// when every worker has stopped at a point; otherwise after KEEL_FAULT_GRACE_MS (default 250,
// so the other workers may reach their own points and one death covers several runs), and
// only once every OTHER run that is between committing a tool intent and committing that
// tool's outcome has finished that call (no new call starts meanwhile). So the only runs
// caught mid-tool are runs at their own fault point; other runs may be caught anywhere else
// (mid model call, mid claim, between steps), where a crash leaves nothing pending. This
// keeps what each run went through deterministic, so a test can check its exact recovery.
import { existsSync, mkdirSync, writeFileSync, writeSync } from "node:fs";
import path from "node:path";
import { buildApp } from "../../control-plane/src/app.js";
import { loadConfig } from "../../control-plane/src/config.js";
import type { AgentSpec } from "../../control-plane/src/domain/agent.js";
import type { Fence, RunStore, Settlement } from "../../control-plane/src/runner/run-store.js";
import type { RunnerDeps } from "../../control-plane/src/runner/runner.js";
import type { ToolDefinition, ToolRegistry } from "../../control-plane/src/tools/tool-registry.js";
import { createTestTools } from "./test-tools.js";

const FAULT_POINTS = ["after_model_call", "after_intent", "during_read", "during_write", "after_tool_result", "after_graph_admitted", "after_settle"] as const;
/** Statuses that end a run. */
const SETTLED = new Set(["succeeded", "failed", "cancelled", "budget_exhausted"]);
type FaultPoint = (typeof FAULT_POINTS)[number];

const READ_TOOL = "test.echo";
const PROPOSE_TOOL_NAME = "keel.propose_work_graph";
const PROPOSE_TOOL = `${PROPOSE_TOOL_NAME}.v1`;
const WRITE_TOOL = "test.append_line";

/** Longest wait for other runs' in-flight tool calls before killing anyway (reported on stderr). */
const QUIESCE_MAX_MS = 3_000;

function say(line: string): void {
  writeSync(2, `${line}\n`); // synchronous: it must be out before a SIGKILL
}

interface FaultInjector {
  readonly wrapDeps: (deps: RunnerDeps) => RunnerDeps;
  readonly wrapTools: (tools: readonly ToolDefinition[]) => ToolDefinition[];
}

function createFaultInjector(point: FaultPoint, faultDir: string, workers: number, graceMs: number): FaultInjector {
  mkdirSync(faultDir, { recursive: true });
  /** Runs stopped at their fault point, waiting for the kill. */
  const frozen = new Set<string>();
  /** Per run, the tool calls between their intent commit (started) and their outcome commit (finished). */
  const inFlight = new Map<string, Set<string>>();
  let killRequestedAt: number | undefined;
  /** Once set, no new tool call starts: the kill waits only for calls already under way. */
  let quiescing = false;

  const markerOf = (runId: string) => path.join(faultDir, `${runId}.fault`);
  const due = (runId: string) => !frozen.has(runId) && !existsSync(markerOf(runId));
  const never = () => new Promise<never>(() => {});

  const othersMidTool = () => [...inFlight].filter(([runId, ids]) => ids.size > 0 && !frozen.has(runId)).map(([runId]) => runId);

  const tick = (): void => {
    const waited = Date.now() - (killRequestedAt ?? 0);
    // Every worker stopped at its point: nothing else is moving.
    if (frozen.size >= workers) process.kill(process.pid, "SIGKILL");
    // The grace lets the other workers reach their own fault points, so one death covers several runs.
    if (waited >= graceMs) {
      quiescing = true;
      const busy = othersMidTool();
      if (busy.length === 0 || waited > graceMs + QUIESCE_MAX_MS) {
        if (busy.length > 0) say(`FAULT_QUIESCE_TIMEOUT runs still mid-tool: ${busy.join(",")}`);
        process.kill(process.pid, "SIGKILL");
      }
    }
    setTimeout(tick, 1);
  };

  /** Stops this run here for good: marker first (synchronously), then the kill. */
  const crashHere = (runId: string, detail: string): Promise<never> => {
    writeFileSync(markerOf(runId), `${point} pid=${process.pid} ${detail}\n`);
    frozen.add(runId);
    say(`FAULT ${point} run=${runId} ${detail}`);
    if (killRequestedAt === undefined) {
      killRequestedAt = Date.now();
      tick(); // may kill right here
    } else if (frozen.size >= workers) {
      process.kill(process.pid, "SIGKILL");
    }
    return never();
  };

  const open = (runId: string, ids: readonly string[]) => {
    const set = inFlight.get(runId) ?? new Set<string>();
    for (const id of ids) set.add(id);
    inFlight.set(runId, set);
  };
  const close = (runId: string, ids: readonly string[]) => {
    const set = inFlight.get(runId);
    if (set === undefined) return;
    for (const id of ids) set.delete(id);
    if (set.size === 0) inFlight.delete(runId);
  };

  /** Read results the runner held back to commit with this commit (see read-outcome-batching.ts). */
  const heldIds = (commit: Settlement): string[] => (commit.priorOutcomes ?? []).map((o) => o.invocationId);
  const heldResultKnown = (commit: Settlement): boolean => (commit.priorOutcomes ?? []).some((o) => o.outcome === "succeeded" || o.outcome === "failed");
  /** Commits, then marks the held reads it carried as finished. */
  const carrying = async <T>(commit: Fence & Settlement, work: () => Promise<T>): Promise<T> => {
    try {
      return await work();
    } finally {
      close(commit.runId, heldIds(commit));
    }
  };

  const wrapStore = (store: RunStore): RunStore => ({
    ...store,
    async commitStep(commit) {
      if (point === "after_model_call" && commit.step?.modelCall !== undefined && due(commit.runId)) {
        return crashHere(commit.runId, `step ${commit.step.index} model call answered, not committed`);
      }
      if (point === "after_tool_result" && heldResultKnown(commit) && due(commit.runId)) {
        return crashHere(commit.runId, `held read results ${heldIds(commit).join(",")} known, not committed`);
      }
      const pending = (commit.step?.invocations ?? []).filter((i) => i.status === "pending").map((i) => i.id);
      // A proposal parks its run on the graph it admitted: nothing is executing, so the kill need not wait for it.
      const executing = (commit.step?.invocations ?? []).filter((i) => i.status === "pending" && !i.toolName.startsWith(PROPOSE_TOOL_NAME)).map((i) => i.id);
      if (point === "after_settle" && pending.length === 0 && SETTLED.has(commit.status) && due(commit.runId)) {
        await carrying(commit, () => store.commitStep(commit));
        return crashHere(commit.runId, `settled ${commit.status}, committed`);
      }
      if (pending.length === 0) return carrying(commit, () => store.commitStep(commit));
      if (quiescing) {
        // The kill is coming: start no new tool call (this step stays uncommitted; its model call
        // replays). The read results it carried are committed on their own, so those calls finish.
        if (heldIds(commit).length > 0) {
          const { runId, workerId, epoch, usage } = commit;
          const priorOutcomes = commit.priorOutcomes ?? [];
          await carrying(commit, () => store.commitStep({ runId, workerId, epoch, step: undefined, priorOutcomes, status: "running", usage, emissions: [], summary: "read results" }));
        }
        return never();
      }
      open(commit.runId, executing);
      let control;
      try {
        control = await carrying(commit, () => store.commitStep(commit));
      } catch (error) {
        close(commit.runId, executing);
        throw error;
      }
      if (point === "after_intent" && due(commit.runId)) {
        return crashHere(commit.runId, `step ${commit.step?.index ?? -1} intents committed: ${pending.join(",")}`);
      }
      return control;
    },
    async commitToolOutcome(commit) {
      if (point === "after_tool_result" && (commit.outcome === "succeeded" || commit.outcome === "failed" || heldResultKnown(commit)) && due(commit.runId)) {
        return crashHere(commit.runId, `tool ${commit.invocationId} ${commit.outcome}, not committed`);
      }
      try {
        return await carrying(commit, () => store.commitToolOutcome(commit));
      } finally {
        close(commit.runId, [commit.invocationId]);
      }
    },
  });

  const wrapTool = (tool: ToolDefinition): ToolDefinition => {
    const crashes = (point === "during_read" && tool.name === READ_TOOL) || (point === "during_write" && tool.name === WRITE_TOOL);
    if (!crashes) return tool;
    return {
      ...tool,
      async execute(args, context) {
        const result = await tool.execute(args, context);
        if (due(context.runId)) return crashHere(context.runId, `inside ${tool.name} ${context.invocationId} (it ran; result not returned)`);
        return result;
      },
    };
  };

  /** The built-in proposal tool is Keel's own, so it is wrapped where the runner looks tools up. */
  const wrapRegistry = (tools: ToolRegistry): ToolRegistry => {
    if (point !== "after_graph_admitted") return tools;
    return {
      ...tools,
      get(fullName) {
        const tool = tools.get(fullName);
        if (tool === undefined || fullName !== PROPOSE_TOOL) return tool;
        const definition: ToolDefinition = {
          ...tool.definition,
          async execute(args, context) {
            const result = await tool.definition.execute(args, context);
            if (result.ok && "parked" in result && result.parked === true && due(context.runId)) return crashHere(context.runId, "graph admitted, the proposal's result not returned");
            return result;
          },
        };
        return { ...tool, definition };
      },
    };
  };

  return {
    wrapDeps: (deps) => ({ ...deps, store: wrapStore(deps.store), tools: wrapRegistry(deps.tools) }),
    wrapTools: (tools) => tools.map(wrapTool),
  };
}

function required(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`fault-serve: ${name} is required`);
  return value;
}

async function main(): Promise<void> {
  const env = process.env;
  const config = loadConfig(env);
  const tools = createTestTools({ effectsDir: required("KEEL_EFFECTS_DIR"), delayMs: Number(env["KEEL_TOOL_DELAY_MS"] ?? 0) });
  const faultName = env["KEEL_FAULT"] ?? "";
  let fault: FaultInjector | undefined;
  if (faultName !== "") {
    const point = FAULT_POINTS.find((p) => p === faultName);
    if (point === undefined) throw new Error(`fault-serve: KEEL_FAULT must be one of ${FAULT_POINTS.join(", ")}`);
    fault = createFaultInjector(point, required("KEEL_FAULT_DIR"), config.workers, Number(env["KEEL_FAULT_GRACE_MS"] ?? 250));
  }

  const app = await buildApp(config, env, {
    tools: fault === undefined ? tools : fault.wrapTools(tools),
    ...(fault === undefined ? {} : { wrapRunnerDeps: fault.wrapDeps }),
  });
  for (const agent of JSON.parse(env["KEEL_TEST_AGENTS"] ?? "[]") as AgentSpec[]) await app.agents.put(agent);
  const { url, http1Url } = await app.server.listen({ host: config.host, port: config.port, http1Port: config.http1Port });
  app.log.info({ url, http1Url, workers: config.workers, fault: faultName || undefined }, "keel is serving (fault-serve)");
  process.stdout.write(`LISTENING ${url}\n`);
  app.startWorkers();

  await new Promise<void>((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
  await app.stop();
}

main().catch((error: unknown) => {
  say(`fault-serve: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
  process.exit(1);
});
