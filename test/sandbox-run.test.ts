// Runs that use a real sandbox host: a `keel sandbox-agent` process on the Docker engine.
// A scripted run writes, executes and reads back; two concurrent runs never see each other's
// files; a granted secret reaches only its own run's workspace and never the ledger or a log.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { connectClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedTurn, toolCall as call, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import {
  CapturedLog,
  containersOfHost,
  killAllChildren,
  removeContainersOfHost,
  skipWithoutDocker,
  startSandboxAgent,
  uniqueHostId,
  waitFor,
  type AgentProcess,
} from "./support/sandbox-support.js";

const SANDBOX_TOOLS = ["sandbox.exec.v1", "sandbox.read_file.v1", "sandbox.write_file.v1", "sandbox.list_files.v1"];
const CANARY = `canary-${randomBytes(12).toString("hex")}`;

const turn = (toolCalls: ScriptedTurn["toolCalls"], options: { reply?: string; delayMs?: number } = {}): ScriptedTurn =>
  scriptedTurn(options.reply ?? "", toolCalls, { delayMs: options.delayMs ?? 0, inputTokens: 10, outputTokens: 10 });

function sandboxAgent(id: string, turns: ScriptedTurn[], sandbox: Partial<AgentSpec["sandbox"]> = {}): AgentSpec {
  return scriptedAgent(id, turns, { displayName: id, tools: toolGrants(SANDBOX_TOOLS), sandbox: { ...DEMO_AGENT.sandbox, ...sandbox } });
}

const BUILDER = sandboxAgent("builder", [
  turn([call("sandbox.write_file.v1", { path: "notes/plan.txt", content: "write the plan\nship it\n" })]),
  turn([call("sandbox.exec.v1", { command: "cd notes && tr a-z A-Z < plan.txt > PLAN.txt && echo built && echo 'a warning' >&2 && wc -l PLAN.txt" })]),
  turn([
    call("sandbox.read_file.v1", { path: "/workspace/notes/PLAN.txt" }),
    call("sandbox.list_files.v1", { path: "notes" }),
    call("sandbox.read_file.v1", { path: "../../etc/passwd" }),
  ]),
  turn([], { reply: "plan built" }),
]);

// Both runs write first, then (after the other has written too) look for the other's file.
const ALPHA = sandboxAgent(
  "alpha",
  [
    turn([call("sandbox.write_file.v1", { path: "alpha.txt", content: "alpha was here\n" })]),
    turn(
      [
        call("sandbox.exec.v1", {
          // The secret is printed whole, then in two pieces with a pause between (two chunks on the wire).
          command:
            'ls /workspace; test -e /workspace/beta.txt || echo no-beta-here; echo "token=$DEPLOY_TOKEN"; ' +
            'printf %s "$DEPLOY_TOKEN" | head -c 9; sleep 0.3; printf "%s\\n" "$DEPLOY_TOKEN" | tail -c +10',
        }),
      ],
      { delayMs: 1500 },
    ),
    turn([], { reply: "alpha done" }),
  ],
  { secrets: [{ envVar: "DEPLOY_TOKEN", sourceEnv: "KEEL_SECRET_TEST_CANARY" }] },
);

const BETA = sandboxAgent("beta", [
  turn([call("sandbox.write_file.v1", { path: "beta.txt", content: "beta was here\n" })]),
  turn([call("sandbox.exec.v1", { command: 'ls /workspace; test -e /workspace/alpha.txt || echo no-alpha-here; env; echo "token=${DEPLOY_TOKEN:-unset}"' })], {
    delayMs: 1500,
  }),
  turn([call("sandbox.list_files.v1", { path: "/workspace" })]),
  turn([], { reply: "beta done" }),
]);

const skip = skipWithoutDocker("sandbox runs");

describe.skipIf(skip)("runs in sandbox workspaces", () => {
  let keel: TestKeel;
  let agent: AgentProcess;
  let dataDir: string;
  const keelLog = new CapturedLog();
  const hostId = uniqueHostId("run");

  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 4,
      agents: [BUILDER, ALPHA, BETA],
      log: keelLog.logger("debug"),
      env: {
        KEEL_SECRET_TEST_CANARY: CANARY,
        KEEL_SANDBOX_KEEP_MS: "0",
        KEEL_SANDBOX_SWEEP_MS: "200",
        KEEL_SANDBOX_HEARTBEAT_MS: "1000",
      },
    });
    dataDir = await mkdtemp(path.join(tmpdir(), "keel-sandbox-run-"));
    agent = await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId), hostId, dataDir, capacity: 4 });
  });

  afterAll(async () => {
    await killAllChildren();
    await keel?.stop();
    removeContainersOfHost(hostId);
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  });

  const submit = async (agentId: string) => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const suffix = randomBytes(4).toString("hex");
    const { runId } = await ingress.submitMessage({
      agentId,
      conversationId: `c-${agentId}-${suffix}`,
      actor: { id: "tester" },
      messageId: `m-${suffix}`,
      text: "go",
      connector: "test",
    });
    return runId;
  };

  const settled = (runId: string) =>
    waitFor(
      `run ${runId} to settle`,
      async () => {
        const { run } = await connectClient(RunService, keel.url, keel.tokens.operator).getRun({ runId });
        return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.WAITING, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)
          ? run
          : undefined;
      },
      45_000,
    );

  const invocations = async (runId: string) => {
    const { steps } = await connectClient(RunService, keel.url, keel.tokens.operator).listRunSteps({ runId });
    return steps.flatMap((step) => step.toolInvocations);
  };

  const streamed = (invocation: { observations: { stream: string; text: string }[] }, stream: string) =>
    invocation.observations
      .filter((o) => o.stream === stream)
      .map((o) => o.text)
      .join("");

  it("completes a run that writes a file, runs shell commands and reads the result, with each exec's output in the ledger", async () => {
    const runId = await submit("builder");
    const run = await settled(runId);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("plan built");

    const [write, exec, read, list, traversal] = await invocations(runId);
    expect(write).toMatchObject({ toolName: "sandbox.write_file.v1", status: ToolInvocationStatus.SUCCEEDED });
    expect(exec).toMatchObject({ toolName: "sandbox.exec.v1", status: ToolInvocationStatus.SUCCEEDED, exitCode: 0, outputTruncated: false });
    // Output arrived as observations while the command ran, stdout and stderr apart.
    expect(streamed(exec!, "stdout")).toContain("built");
    expect(streamed(exec!, "stdout")).toMatch(/2 PLAN\.txt/);
    expect(streamed(exec!, "stderr")).toBe("a warning\n");
    expect(exec!.resultText).toMatch(/^exit code 0; \d+ ms\n--- output ---\n/);
    expect(read).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, resultText: "WRITE THE PLAN\nSHIP IT\n" });
    expect(list?.resultText).toContain("/workspace/notes/PLAN.txt");
    expect(list?.resultText).toContain("/workspace/notes/plan.txt");
    expect(traversal).toMatchObject({ status: ToolInvocationStatus.REFUSED });
    expect(traversal?.refusalReason).toMatch(/must stay inside \/workspace/);

    // The run ended and the inspection time is 0: its workspace is released and its container removed.
    await waitFor("the finished run's workspace to be released", async () => {
      const db = new pg.Client({ connectionString: keel.databaseUrl });
      await db.connect();
      try {
        const { rows } = await db.query<{ status: string }>("SELECT status FROM workspaces WHERE run_id = $1", [runId]);
        return rows.length === 1 && rows[0]!.status === "released" ? true : undefined;
      } finally {
        await db.end();
      }
    });
    await waitFor("its container to be removed", () => (containersOfHost(hostId).length === 0 ? true : undefined), 15_000);
  });

  it("keeps concurrent runs apart and a granted secret inside its own run's workspace", async () => {
    const [alphaRun, betaRun] = await Promise.all([submit("alpha"), submit("beta")]);
    const [alpha, beta] = await Promise.all([settled(alphaRun), settled(betaRun)]);
    expect(alpha.status).toBe(RunStatus.SUCCEEDED);
    expect(beta.status).toBe(RunStatus.SUCCEEDED);

    const alphaExec = (await invocations(alphaRun)).find((i) => i.toolName === "sandbox.exec.v1")!;
    const betaCalls = await invocations(betaRun);
    const betaExec = betaCalls.find((i) => i.toolName === "sandbox.exec.v1")!;
    const betaList = betaCalls.find((i) => i.toolName === "sandbox.list_files.v1")!;

    // Each run sees its own file only, though both were written before either looked.
    const alphaOut = streamed(alphaExec, "stdout");
    const betaOut = streamed(betaExec, "stdout");
    expect(alphaOut).toContain("alpha.txt");
    expect(alphaOut).toContain("no-beta-here");
    expect(alphaOut).not.toContain("beta.txt");
    expect(betaOut).toContain("beta.txt");
    expect(betaOut).toContain("no-alpha-here");
    expect(betaOut).not.toContain("alpha.txt");
    expect(betaList.resultText).toBe("- 14 /workspace/beta.txt");

    // Alpha's workspace had the secret (printed whole and split across chunks); it was redacted on the way in.
    expect(alphaOut).toContain("token=[redacted:DEPLOY_TOKEN]\n[redacted:DEPLOY_TOKEN]\n");
    // Beta's workspace never had it.
    expect(betaOut).toContain("token=unset");
    expect(betaOut).not.toContain("DEPLOY_TOKEN");

    // The canary is nowhere in the ledger: every text-like column of every table.
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      const { rows: columns } = await db.query<{ table_name: string; column_name: string }>(
        `SELECT table_name, column_name FROM information_schema.columns
         WHERE table_schema = 'public' AND data_type IN ('text', 'jsonb', 'json', 'character varying')`,
      );
      expect(columns.length).toBeGreaterThan(20);
      const hits: string[] = [];
      for (const { table_name, column_name } of columns) {
        const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${table_name}" WHERE "${column_name}"::text LIKE $1`, [`%${CANARY}%`]);
        if (rows[0]!.n > 0) hits.push(`${table_name}.${column_name}`);
      }
      expect(hits).toEqual([]);
      // The scan does find what is there: the marker that replaced the secret.
      const { rows: marked } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM observations WHERE text LIKE '%[redacted:DEPLOY_TOKEN]%'");
      expect(marked[0]!.n).toBeGreaterThan(0);
    } finally {
      await db.end();
    }

    // Nor in the control plane's logs (at debug level) or the sandbox agent's.
    expect(keelLog.lines.length).toBeGreaterThan(0);
    expect(keelLog.text()).not.toContain(CANARY);
    expect(agent.log.lines.length).toBeGreaterThan(0);
    expect(agent.log.text()).not.toContain(CANARY);
  });
});
