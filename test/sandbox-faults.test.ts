// Sandbox faults with real processes: hostile workloads through the exec tool, a sandbox
// agent SIGKILLed mid-exec (and its orphaned container reaped when it comes back), and a
// control plane restarted mid-exec while the agent keeps running (the real outcome is
// re-attached, never declared unknown).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { agentSpecToProto } from "../control-plane/src/api/agent-spec-convert.js";
import type { AgentSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { connectClient } from "./support/clients.js";
import { freePort } from "./support/global-setup.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedTurn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import {
  containersOfHost,
  KEEL_BIN,
  killAllChildren,
  removeContainersOfHost,
  ROOT,
  skipWithoutDocker,
  startSandboxAgent,
  uniqueHostId,
  waitFor,
} from "./support/sandbox-support.js";

const SANDBOX_TOOLS = ["sandbox.exec.v1", "sandbox.read_file.v1", "sandbox.write_file.v1", "sandbox.list_files.v1"];
const SETTLED = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.WAITING, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED];

const exec = (args: Record<string, unknown>) => toolCall("sandbox.exec.v1", args);
const turn = (toolCalls: ScriptedTurn["toolCalls"], reply = ""): ScriptedTurn => scriptedTurn(reply, toolCalls, { inputTokens: 10, outputTokens: 10 });

function sandboxAgent(id: string, turns: ScriptedTurn[], options: { readOnlyCommands?: string[]; labels?: string[] } = {}): AgentSpec {
  const tools = toolGrants(SANDBOX_TOOLS, options.readOnlyCommands ?? []);
  return scriptedAgent(id, turns, { displayName: id, tools, sandbox: { ...DEMO_AGENT.sandbox, labels: options.labels ?? [] } });
}

const HOSTILE = sandboxAgent(
  "hostile",
  [
    // The sleep is forked before the bomb, which runs in a subshell: when the pids run out and the
    // subshell dies of a failed fork, the shell still waits on the sleep until the timeout.
    turn([exec({ command: "sleep 30 & (f() { f | f & }; f); wait", timeout_ms: 4000 })]),
    turn([exec({ command: "yes keel-output | head -c 100000000" })]),
    turn([exec({ command: "echo still-usable" })]),
    turn([], "survived"),
  ],
  { labels: ["pool=hostile"] },
);
// `sleep 5` on its own is declared read-only; the same command for the writer is a write.
const READER = sandboxAgent("reader", [turn([exec({ command: "sleep 5" })]), turn([], "read was interrupted")], {
  readOnlyCommands: ["sleep"],
  labels: ["pool=doomed"],
});
// A write whose output the ledger refuses to store (a trigger stands in for a failing database).
const SPOILED = sandboxAgent("spoiled", [turn([exec({ command: "echo poison-observation; echo more" })]), turn([], "never")], { labels: ["pool=spoiled"] });
const WRITER = sandboxAgent("writer", [turn([exec({ command: "sleep 5" })]), turn([], "never")], { labels: ["pool=doomed"] });
// Both are writes (chained commands). One finishes while the control plane is down, one after it is back.
const QUICK = sandboxAgent("quick", [turn([exec({ command: "echo started; sleep 1; echo finished-while-down" })]), turn([], "quick survived")]);
const SLOW = sandboxAgent("slow", [turn([exec({ command: "echo started; sleep 6; echo finished-after-restart" })]), turn([], "slow survived")]);

const skip = skipWithoutDocker("sandbox faults");

function client(url: string, token: string) {
  return {
    ingress: connectClient(IngressService, url, token),
    runs: connectClient(RunService, url, token),
    agents: connectClient(AgentService, url, token),
  };
}

async function submit(url: string, token: string, agentId: string): Promise<string> {
  const suffix = randomBytes(4).toString("hex");
  const { runId } = await client(url, token).ingress.submitMessage({
    agentId,
    conversationId: `c-${agentId}-${suffix}`,
    actor: { id: "tester" },
    messageId: `m-${suffix}`,
    text: "go",
    connector: "test",
  });
  return runId;
}

async function settled(url: string, token: string, runId: string, timeoutMs = 45_000): Promise<Run> {
  return waitFor(
    `run ${runId} to settle`,
    async () => {
      const { run } = await client(url, token).runs.getRun({ runId }).catch(() => ({ run: undefined }));
      return run !== undefined && SETTLED.includes(run.status) ? run : undefined;
    },
    timeoutMs,
  );
}

async function invocations(url: string, token: string, runId: string) {
  const { steps } = await client(url, token).runs.listRunSteps({ runId });
  return steps.flatMap((step) => step.toolInvocations);
}

describe.skipIf(skip)("sandbox faults", () => {
  let keel: TestKeel;
  const dirs: string[] = [];
  const hosts: string[] = [];
  const tempDir = async (label: string) => {
    const dir = await mkdtemp(path.join(tmpdir(), `keel-sandbox-${label}-`));
    dirs.push(dir);
    return dir;
  };

  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 4,
      agents: [HOSTILE, READER, WRITER, SPOILED],
      env: {
        KEEL_SANDBOX_KEEP_MS: "0",
        KEEL_SANDBOX_SWEEP_MS: "200",
        KEEL_SANDBOX_HEARTBEAT_MS: "500",
        KEEL_SANDBOX_RECONNECT_GRACE_MS: "1000",
        KEEL_SANDBOX_REATTACH_WAIT_MS: "2000",
      },
    });
  });

  afterAll(async () => {
    await killAllChildren();
    await keel?.stop();
    for (const host of hosts) removeContainersOfHost(host);
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("contains a fork bomb and 100 MB of output, records both, and keeps answering meanwhile", async () => {
    const hostId = uniqueHostId("hostile");
    hosts.push(hostId);
    await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId, { labels: { pool: "hostile" } }), hostId, dataDir: await tempDir("hostile"), labels: ["pool=hostile"] });
    const runId = await submit(keel.url, keel.tokens.connector, "hostile");

    // GetRun is timed all along: the control plane must not stall behind the workload.
    const runs = client(keel.url, keel.tokens.operator).runs;
    let slowestMs = 0;
    let polls = 0;
    let run: Run | undefined;
    while (run === undefined) {
      const started = performance.now();
      const { run: current } = await runs.getRun({ runId });
      slowestMs = Math.max(slowestMs, performance.now() - started);
      polls += 1;
      if (current !== undefined && SETTLED.includes(current.status)) run = current;
      else await new Promise((resolve) => setTimeout(resolve, 50));
      if (polls > 2000) throw new Error("the hostile run did not settle");
    }
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("survived");
    expect(polls).toBeGreaterThan(10);
    expect(slowestMs).toBeLessThan(1000);

    const [bomb, flood, after] = await invocations(keel.url, keel.tokens.operator, runId);
    // The fork bomb hit its pids limit and was killed at its timeout: recorded as a failed call.
    expect(bomb).toMatchObject({ status: ToolInvocationStatus.FAILED });
    expect(bomb?.resultText).toMatch(/timed out and was killed/);
    // 100 MB of output: the first MiB kept as observations, the rest dropped and marked.
    expect(flood).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, exitCode: 0, outputTruncated: true });
    const kept = flood!.observations.filter((o) => o.stream === "stdout").reduce((sum, o) => sum + Buffer.byteLength(o.text), 0);
    expect(kept).toBe(1024 * 1024);
    expect(flood!.observations.some((o) => o.stream === "keel" && o.text.includes("output truncated"))).toBe(true);
    expect(flood!.resultText).toMatch(/output truncated at 1048576 bytes/);
    expect(Buffer.byteLength(flood!.resultText)).toBeLessThan(8 * 1024);
    // And the workspace still works afterwards.
    expect(after).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED });
    expect(after?.resultText).toContain("still-usable");
  });

  it("turns a read into interrupted and a write into unknown_outcome when the agent is SIGKILLed mid-exec, and reaps the orphans on restart", async () => {
    const hostId = uniqueHostId("doomed");
    hosts.push(hostId);
    const dataDir = await tempDir("doomed");
    const doomedToken = await keel.hostToken(hostId, { labels: { pool: "doomed" } });
    const agent = await startSandboxAgent({ url: keel.url, token: doomedToken, hostId, dataDir, labels: ["pool=doomed"] });
    const [readRun, writeRun] = await Promise.all([submit(keel.url, keel.tokens.connector, "reader"), submit(keel.url, keel.tokens.connector, "writer")]);
    let started = 0;
    await agent.waitForLog((entry) => entry["msg"] === "exec started" && ++started === 2);
    await agent.kill("SIGKILL");

    const [read, write] = await Promise.all([settled(keel.url, keel.tokens.operator, readRun), settled(keel.url, keel.tokens.operator, writeRun)]);
    expect(read.status).toBe(RunStatus.SUCCEEDED);
    expect(read.finalReply).toBe("read was interrupted");
    expect((await invocations(keel.url, keel.tokens.operator, readRun))[0]).toMatchObject({ status: ToolInvocationStatus.INTERRUPTED });
    expect(write.status).toBe(RunStatus.WAITING);
    expect((await invocations(keel.url, keel.tokens.operator, writeRun))[0]).toMatchObject({ status: ToolInvocationStatus.UNKNOWN_OUTCOME });

    // Their containers outlived the agent: orphans, and the control plane has marked their workspaces lost.
    expect(containersOfHost(hostId)).toHaveLength(2);
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      const { rows } = await db.query<{ status: string }>("SELECT status FROM workspaces WHERE host_id = $1", [hostId]);
      expect(rows.map((r) => r.status)).toEqual(["lost", "lost"]);
    } finally {
      await db.end();
    }

    // The agent comes back as a new process on the same host: the orphans are reaped.
    const restarted = await startSandboxAgent({ url: keel.url, token: doomedToken, hostId, dataDir, labels: ["pool=doomed"], log: agent.log });
    await restarted.waitForLog((entry) => entry["msg"] === "reaped workspaces the control plane no longer knows");
    await waitFor("the orphaned containers to be gone", () => (containersOfHost(hostId).length === 0 ? true : undefined), 20_000);
  });

  it("records a write whose output could not be stored as unknown_outcome, never failed", async () => {
    const hostId = uniqueHostId("spoiled");
    hosts.push(hostId);
    await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId, { labels: { pool: "spoiled" } }), hostId, dataDir: await tempDir("spoiled"), labels: ["pool=spoiled"] });
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      await db.query(`CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.text LIKE '%poison-observation%' THEN RAISE EXCEPTION 'disk full (test)'; END IF; RETURN NEW; END $$`);
      await db.query("CREATE TRIGGER refuse_poison BEFORE INSERT ON observations FOR EACH ROW EXECUTE FUNCTION refuse_poison()");
      const runId = await submit(keel.url, keel.tokens.connector, "spoiled");
      const run = await settled(keel.url, keel.tokens.operator, runId);
      // The command ran; only its record is missing. A failed write would invite running it again.
      expect(run.status).toBe(RunStatus.WAITING);
      const [write] = await invocations(keel.url, keel.tokens.operator, runId);
      expect(write).toMatchObject({ status: ToolInvocationStatus.UNKNOWN_OUTCOME });
      const { rows } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [runId]);
      expect(rows.map((r) => r.summary).join("\n")).toMatch(/the command ran \(exit code 0\) but its output could not be recorded: disk full \(test\)/);
    } finally {
      await db.query("DROP TRIGGER IF EXISTS refuse_poison ON observations; DROP FUNCTION IF EXISTS refuse_poison()").catch(() => undefined);
      await db.end();
    }
  });

  it("re-attaches to an exec that outlived a control-plane restart and commits its real outcome", async () => {
    const databaseUrl = await createTestDatabase();
    const dataDir = await tempDir("restart-cp");
    const port = await freePort();
    const hostId = uniqueHostId("steady");
    hosts.push(hostId);
    const env = {
      ...process.env,
      DATABASE_URL: databaseUrl,
      KEEL_DATA_DIR: dataDir,
      KEEL_PORT: String(port),
      KEEL_HTTP1_PORT: "0",
      KEEL_WORKERS: "2",
      KEEL_LEASE_MS: "1000",
      KEEL_IDLE_POLL_MS: "200",
      KEEL_DB_POOL_MAX: "5",
      KEEL_LOG_LEVEL: "info",
      KEEL_SANDBOX_HEARTBEAT_MS: "500",
      KEEL_SANDBOX_REATTACH_WAIT_MS: "20000",
    };
    const serve = async (): Promise<{ child: ChildProcess; url: string; logs: string[] }> => {
      const child = spawn(process.execPath, [KEEL_BIN, "serve", "--dev"], { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
      const logs: string[] = [];
      child.stderr.on("data", (chunk: Buffer) => logs.push(chunk.toString("utf8")));
      const url = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`keel did not start: ${logs.join("")}`)), 30_000);
        child.once("exit", () => reject(new Error(`keel exited: ${logs.join("")}`)));
        createInterface({ input: child.stdout }).on("line", (line) => {
          logs.push(line);
          const entry = JSON.parse(line) as Record<string, unknown>;
          if (typeof entry["msg"] === "string" && entry["msg"].startsWith("keel is serving")) {
            clearTimeout(timer);
            resolve(String(entry["url"]));
          }
        });
      });
      return { child, url, logs };
    };
    const killHard = async (child: ChildProcess) => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      if (child.exitCode === null && child.signalCode === null) await new Promise((resolve) => child.once("exit", resolve));
    };

    const first = await serve();
    try {
      const admin = (await readFile(path.join(dataDir, "dev-token"), "utf8")).trim();
      for (const spec of [QUICK, SLOW]) await client(first.url, admin).agents.putAgent({ agent: agentSpecToProto(spec) });
      const hostToken = execFileSync(process.execPath, [KEEL_BIN, "token", "create", "--role", "sandbox-host", "--host-id", hostId], { cwd: ROOT, env, encoding: "utf8" }).trim();
      const agent = await startSandboxAgent({ url: first.url, token: hostToken, hostId, dataDir: await tempDir("steady") });

      const runIds = [await submit(first.url, admin, "quick"), await submit(first.url, admin, "slow")];
      let started = 0;
      await agent.waitForLog((entry) => entry["msg"] === "exec started" && ++started === 2);
      // Their first lines are in the ledger: the first process was watching when it died.
      const db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
      try {
        await waitFor("both execs' first output to be observed", async () => {
          const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM observations WHERE stream = 'stdout' AND text LIKE 'started%'");
          return rows[0]!.n === 2 ? true : undefined;
        });
      } finally {
        await db.end();
      }
      await killHard(first.child); // mid-exec: both commands go on in their containers

      const second = await serve();
      try {
        for (const [runId, reply, last] of [
          [runIds[0]!, "quick survived", "finished-while-down"],
          [runIds[1]!, "slow survived", "finished-after-restart"],
        ] as const) {
          const run = await settled(second.url, admin, runId, 60_000);
          const [call] = await invocations(second.url, admin, runId);
          // What both processes and the host said, should the run not end as it should.
          const said = [`first:`, ...first.logs, `second:`, ...second.logs, `host:`, ...agent.log.lines].join("\n");
          expect(run.status, said).toBe(RunStatus.SUCCEEDED);
          expect(run.finalReply).toBe(reply);
          expect(call).toMatchObject({ toolName: "sandbox.exec.v1", status: ToolInvocationStatus.SUCCEEDED, exitCode: 0 });
          expect(call?.resultText).toMatch(new RegExp(`started\\n${last}\\n$`));
          // The output before the restart was observed by the first process, the rest by the second.
          const stdout = call!.observations.filter((o) => o.stream === "stdout").map((o) => o.text).join("");
          expect(stdout).toBe(`started\n${last}\n`);
        }
        const check = new pg.Client({ connectionString: databaseUrl });
        await check.connect();
        try {
          const { rows } = await check.query<{ n: number }>("SELECT count(*)::int AS n FROM tool_invocations WHERE status <> 'succeeded'");
          expect(rows[0]!.n).toBe(0);
        } finally {
          await check.end();
        }
        expect(second.logs.filter((line) => line.includes("re-attached to a command that outlived its worker"))).toHaveLength(2);
      } finally {
        await killHard(second.child);
      }
    } finally {
      await killHard(first.child);
    }
  });
});
