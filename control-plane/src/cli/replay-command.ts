// `keel replay`: re-runs recorded runs against the current code, policy and tools, in this
// process, straight from the ledger (the server need not run, and nothing is written to it).
import { parseArgs } from "node:util";
import { pino } from "pino";
import { openKeelLedger } from "../app.js";
import type { KeelConfig } from "../config.js";
import { parseDuration } from "../domain/token-scope.js";
import { createReplaySource } from "../ledger/replay-source.repository.js";
import { describeDivergence } from "../replay/divergence.js";
import { replayRun } from "../replay/replay-run.js";
import { askUserTool } from "../tools/ask-user-tool.js";
import { createReportProgressTool } from "../tools/report-progress-tool.js";
import type { SandboxDispatcher } from "../tools/sandbox-dispatcher.js";
import { createSandboxTools } from "../tools/sandbox-tools.js";
import { createToolRegistry, type ToolDefinition } from "../tools/tool-registry.js";
import { formatTable } from "./table.js";

export const REPLAY_USAGE = "keel replay RUN_ID | keel replay --all [--since 1d] [--limit N]   (units: s, m, h, d, w)";

/** A replay never executes a tool; a dispatcher reached anyway is a bug, so it says so. */
const noSandbox = new Proxy({} as SandboxDispatcher, {
  get: () => () => Promise.reject(new Error("keel replay never executes tools")),
});

/** The tools `keel serve` registers, by definition only: their schemas, effects and policy checks. */
function servedTools(config: KeelConfig, env: Readonly<Record<string, string | undefined>>, extra: readonly ToolDefinition[]): ToolDefinition[] {
  const sandbox = createSandboxTools({
    dispatcher: noSandbox,
    env,
    defaultExecTimeoutMs: config.sandbox.defaultExecTimeoutMs,
    maxExecTimeoutMs: config.sandbox.maxExecTimeoutMs,
    maxOutputBytes: config.sandbox.maxOutputBytes,
  });
  return [askUserTool, createReportProgressTool(), ...sandbox, ...extra];
}

/**
 * Exit 0 when every replayed run matches its recording, 1 when one diverges (or cannot be
 * replayed), 2 for a usage error. `extraTools` are a deployment's (or a test's) own tools.
 */
export async function replayCommand(
  args: readonly string[],
  config: () => KeelConfig,
  out: (line: string) => void,
  options: { readonly env?: Readonly<Record<string, string | undefined>>; readonly extraTools?: readonly ToolDefinition[]; readonly now?: Date } = {},
): Promise<number> {
  let parsed: { values: { all?: boolean | undefined; since?: string | undefined; limit?: string | undefined }; positionals: string[] };
  try {
    parsed = parseArgs({
      args: [...args],
      allowPositionals: true,
      options: { all: { type: "boolean", default: false }, since: { type: "string" }, limit: { type: "string" } },
    });
  } catch (error) {
    return usage(error instanceof Error ? error.message : String(error));
  }
  const { values, positionals } = parsed;
  const all = values.all === true;
  if (all === (positionals.length > 0) || positionals.length > 1) return usage("give one RUN_ID, or --all");
  const sinceMs = parseDuration(values.since ?? "1d");
  if (sinceMs === undefined) return usage(`--since ${values.since ?? ""} is not an age such as 1d, 12h or 30m`);
  const limit = Number(values.limit ?? "1000");
  if (!Number.isInteger(limit) || limit < 1) return usage(`--limit ${values.limit ?? ""} must be a positive integer`);

  const loaded = config();
  const tools = createToolRegistry(servedTools(loaded, options.env ?? {}, options.extraTools ?? []));
  const ledger = await openKeelLedger(loaded, pino({ level: "silent" }));
  try {
    const source = createReplaySource(ledger.sql);
    const runIds = all ? await source.endedSince(new Date((options.now ?? new Date()).getTime() - sinceMs), limit) : positionals;
    const rows: string[][] = [];
    let diverged = 0;
    for (const runId of runIds) {
      const recorded = await source.load(runId);
      let lines: string[];
      if (recorded === undefined) lines = [`run ${runId} not found`];
      else if (recorded.agent === undefined) lines = [`agent ${recorded.agentId} of run ${runId} no longer exists`];
      else lines = (await replayRun(recorded, tools, recorded.agent)).divergences.map(describeDivergence);
      if (lines.length > 0) diverged += 1;
      if (!all) {
        out(lines.length === 0 ? `run ${runId}: replayed ${recorded?.stepCount ?? 0} steps, no divergence` : `run ${runId} diverges:`);
        for (const line of lines) out(`  ${line}`);
      }
      rows.push([runId, recorded?.status ?? "?", String(recorded?.stepCount ?? 0), lines.length === 0 ? "identical" : (lines[0] ?? "")]);
    }
    if (all) {
      out(formatTable(["RUN", "RECORDED", "STEPS", "REPLAY"], rows));
      out(`replayed ${runIds.length}, diverged ${diverged}`);
    }
    return diverged === 0 ? 0 : 1;
  } finally {
    await ledger.close();
  }
}

function usage(problem: string): number {
  process.stderr.write(`keel: ${problem}\n\n  ${REPLAY_USAGE}\n`);
  return 2;
}
