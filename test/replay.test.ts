// `keel replay`: a run recorded by a real server, re-run in this process from the ledger with the
// recorded model turns and tool results. Unchanged, it replays identically (and writes nothing);
// with the agent's tools narrowed afterwards, the replay names the call the policy now refuses.
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { replayCommand } from "../control-plane/src/cli/replay-command.js";
import { loadConfig } from "../control-plane/src/config.js";
import { toolCall as call, scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createReplaySource } from "../control-plane/src/ledger/replay-source.repository.js";
import { replayRun } from "../control-plane/src/replay/replay-run.js";
import { createToolRegistry } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";

const AGENT = scriptedAgent(
  "replayed",
  [
    turn("", [call("test.echo.v1", { text: "look first" })]),
    turn("", [call("test.append_line.v1", { key: "k-1" })]),
    turn("wrote k-1 after looking"),
  ],
  { tools: toolGrants(["test.echo.v1", "test.append_line.v1"]) },
);

let keel: TestKeel;
let effectsDir: string;
let db: pg.Client;
let runId: string;

async function waitForEnd(id: string): Promise<Run> {
  const runs = connectClient(RunService, keel.url, keel.tokens.operator);
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const { run } = await runs.getRun({ runId: id });
    if (run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)) return run;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`run ${id} did not end`);
}

/** Row counts of the tables a run writes to: a replay must leave them as they were. */
async function ledgerCounts(): Promise<string> {
  const { rows } = await db.query<{ counts: string }>(
    `SELECT concat_ws(',', (SELECT count(*) FROM runs), (SELECT count(*) FROM run_steps), (SELECT count(*) FROM model_calls),
       (SELECT count(*) FROM tool_invocations), (SELECT count(*) FROM emissions), (SELECT count(*) FROM run_events)) AS counts`,
  );
  return rows[0]!.counts;
}

beforeAll(async () => {
  effectsDir = await mkdtemp(path.join(tmpdir(), "keel-replay-"));
  keel = await startTestKeel({ tools: createTestTools({ effectsDir }), agents: [AGENT] });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
  const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
  ({ runId } = await ingress.submitMessage({ agentId: AGENT.id, conversationId: "replay-c", actor: { id: "alice" }, messageId: "replay-m", text: "look, then write" }));
  const run = await waitForEnd(runId);
  expect(run.status).toBe(RunStatus.SUCCEEDED);
  expect(writesRecorded(effectsDir)).toHaveLength(1);
});

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

describe("keel replay", () => {
  it("replays a recorded scripted run with no divergence, executing nothing and writing nothing", async () => {
    const before = await ledgerCounts();
    const recorded = (await createReplaySource(keel.app.ledger.sql).load(runId))!;
    expect(recorded.turns).toHaveLength(3);
    const report = await replayRun(recorded, createToolRegistry(createTestTools({ effectsDir })), recorded.agent!);
    expect(report.divergences).toEqual([]);
    expect(report.replayed.status).toBe("succeeded");
    expect(report.replayed.finalReply).toBe("wrote k-1 after looking");

    const lines: string[] = [];
    const exit = await replayCommand([runId], () => loadConfig({ DATABASE_URL: keel.databaseUrl }), (line) => lines.push(line), {
      extraTools: createTestTools({ effectsDir }),
    });
    expect(lines).toEqual([`run ${runId}: replayed 3 steps, no divergence`]);
    expect(exit).toBe(0);
    // The write was answered from the recording, not run again; the live ledger did not change.
    expect(writesRecorded(effectsDir)).toHaveLength(1);
    expect(await ledgerCounts()).toBe(before);
  });

  it("reports the call a narrowed policy now refuses, and sums up --all", async () => {
    await keel.app.agents.put({
      ...AGENT,
      revision: 0,
      policy: { kind: "restriction", allowedTools: ["test.echo"], allowedEffects: [], pathRules: [], networkAccess: false },
    });
    const lines: string[] = [];
    const config = () => loadConfig({ DATABASE_URL: keel.databaseUrl });
    const exit = await replayCommand([runId], config, (line) => lines.push(line), { extraTools: createTestTools({ effectsDir }) });
    expect(exit).toBe(1);
    expect(lines[0]).toBe(`run ${runId} diverges:`);
    // Narrowed away, the tool is no longer offered, so the recorded turn's call is refused as unknown.
    expect(lines[1]).toMatch(/^ {2}step 1: policy: test\.append_line\.v1 \{"key":"k-1"\} is now refused: there is no tool "test\.append_line\.v1".*the recording has it succeeded$/);
    expect(writesRecorded(effectsDir)).toHaveLength(1);

    // The summary over every run that ended in the last day: one replayed, one diverged.
    const summary: string[] = [];
    expect(await replayCommand(["--all", "--since", "1d"], config, (line) => summary.push(...line.split("\n")), { extraTools: createTestTools({ effectsDir }) })).toBe(1);
    expect(summary[0]).toMatch(/^RUN\s+RECORDED\s+STEPS\s+REPLAY$/);
    expect(summary[1]).toContain(runId);
    expect(summary[1]).toContain("step 1: policy:");
    expect(summary.at(-1)).toBe("replayed 1, diverged 1");
  });
});
