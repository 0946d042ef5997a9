// The keel command line as people run it: `node bin/keel.js ...` as a child process, with
// --url and --token, against a real server.
import { spawn } from "node:child_process";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { ResolvedOutcome, RunStatus, ToolInvocationStatus, WaitReason, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { toolCall as call, scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools } from "./support/test-tools.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
const CLI_USER = "cli-tester";


function agentWith(id: string, turns: ScriptedTurn[]): AgentSpec {
  return scriptedAgent(id, turns, { tools: toolGrants(["test.echo.v1", "test.append_line.v1", "test.flaky_write.v1"]) });
}

/** A write that never answers until its worker shuts down: its outcome can only be unknown. */
const flakyWrite = defineTool<{ key: string }>({
  name: "test.flaky_write",
  version: 1,
  description: "A write whose connection is lost.",
  parameters: z.object({ key: z.string() }),
  effect: "write",
  execute(_args, context) {
    return new Promise((_resolve, reject) => {
      const stop = () => reject(new Error("lost connection"));
      if (context.signal.aborted) stop();
      else context.signal.addEventListener("abort", stop, { once: true });
    });
  },
});

interface CliResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

describe("the keel CLI", () => {
  let keel: TestKeel;

  beforeAll(async () => {
    keel = await startTestKeel({
      tools: [...createTestTools({ effectsDir: await mkdtemp(path.join(tmpdir(), "keel-cli-effects-")) }), flakyWrite],
      // One worker stays stuck in the flaky write until the server stops.
      workers: 3,
      agents: [
        agentWith("cli-agent", [turn("", [call("test.append_line.v1", { key: "k1" }), call("test.nope.v1", {})]), turn("all done: {{message}}")]),
        agentWith("cli-flaky", [turn("", [call("test.flaky_write.v1", { key: "k7" })]), turn("went on after recovery")]),
        agentWith("cli-slow", [turn("", [call("test.echo.v1", { text: "slowly" })], { delayMs: 1500 }), turn("resumed fine")]),
      ],
    });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  /** Runs `node bin/keel.js ARGS --url URL --token TOKEN`; never blocks the server sharing this process. */
  function cli(...args: string[]): Promise<CliResult> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [KEEL_BIN, ...args, "--url", keel.url, "--token", keel.tokens.admin], {
        cwd: ROOT,
        env: { ...process.env, USER: CLI_USER, KEEL_URL: "", KEEL_TOKEN: "" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
      const timer = setTimeout(() => child.kill("SIGKILL"), 45_000);
      child.once("error", reject);
      child.once("close", (code) => {
        clearTimeout(timer);
        resolve({ code, stdout, stderr });
      });
    });
  }

  const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);

  async function waitFor(runId: string, statuses: readonly RunStatus[]): Promise<Run> {
    for (let i = 0; i < 800; i++) {
      const { run } = await runs().getRun({ runId });
      if (run !== undefined && statuses.includes(run.status)) return run;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`run ${runId} did not reach ${statuses.map((s) => RunStatus[s]).join("|")}`);
  }

  async function submit(agentId: string, text: string): Promise<string> {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const tag = Math.random().toString(36).slice(2, 10);
    const { runId } = await ingress.submitMessage({ agentId, conversationId: `cli-${tag}`, actor: { id: "alice" }, messageId: `m-${tag}`, text, connector: "cli-test" });
    return runId;
  }

  it("sends a message and prints the reply, lists the run, and inspects its steps, tool calls and artifacts", async () => {
    const sent = await cli("send", "--agent", "cli-agent", "--conversation", "cli-c1", "write k1 please");
    expect(sent.stderr).toBe("");
    expect(sent.code).toBe(0);
    const runId = /^run ([0-9a-f-]{36}) queued$/m.exec(sent.stdout)?.[1];
    expect(runId, sent.stdout).toBeDefined();
    expect(sent.stdout).toContain("all done: write k1 please");

    const listed = await cli("runs", "--agent", "cli-agent");
    expect(listed.code).toBe(0);
    expect(listed.stdout).toMatch(/^RUN\s+AGENT\s+CONVERSATION\s+STATUS/);
    expect(listed.stdout).toMatch(new RegExp(`${runId!}\\s+cli-agent\\s+cli-c1\\s+succeeded\\s+2`));

    const inspected = await cli("inspect", runId!);
    expect(inspected.code, inspected.stderr).toBe(0);
    const text = inspected.stdout;
    expect(text).toContain(`run          ${runId!}`);
    expect(text).toMatch(/^status {7}succeeded$/m);
    expect(text).toContain("reply        all done: write k1 please");
    expect(text).toMatch(/^step 0 .* → awaiting_tool/m);
    expect(text).toMatch(/^step 1 .* → succeeded/m);
    expect(text).toContain('  tool  #0 test.append_line.v1 {"key":"k1"} → succeeded');
    expect(text).toContain("  tool  #1 test.nope.v1 {} → refused");
    expect(text).toContain('        refused: there is no tool "test.nope.v1" in this run');
    expect(text).toContain("        [result] appended k1");
    expect(text).toMatch(/^artifacts$/m);
    expect(text).toMatch(/^ {2}line v1 {2}observed {2}\(tool call [0-9a-f-]{36}\) {2}k1$/m);
  });

  it("lists runs waiting on an unknown write outcome and resolves one", async () => {
    const runId = await submit("cli-flaky", "write k7");
    await waitFor(runId, [RunStatus.AWAITING_TOOL]);
    await runs().requeueRun({ runId, actor: { id: "olivia" }, reason: "worker stuck" });
    const waiting = await waitFor(runId, [RunStatus.WAITING]);
    expect(waiting.waitReason).toBe(WaitReason.UNKNOWN_WRITE_OUTCOME);
    const { steps } = await runs().listRunSteps({ runId });
    const invocationId = steps[0]!.toolInvocations[0]!.id;

    const listed = await cli("recover");
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toMatch(/^RUN\s+INVOCATION\s+TOOL\s+ARGUMENTS\s+SINCE$/m);
    expect(listed.stdout).toMatch(new RegExp(`^${runId}\\s+${invocationId}\\s+test\\.flaky_write\\.v1\\s+\\{"key":"k7"\\}\\s+\\d{4}-\\d\\d-\\d\\dT`, "m"));

    const inspectedWaiting = await cli("inspect", runId);
    expect(inspectedWaiting.stdout).toMatch(/^status {7}waiting \(waiting on unknown_write_outcome\)$/m);
    expect(inspectedWaiting.stdout).toContain("test.flaky_write.v1 {\"key\":\"k7\"} → unknown_outcome");

    const badOutcome = await cli("recover", runId, "--invocation", invocationId, "--outcome", "maybe", "--reason", "?");
    expect(badOutcome.code).toBe(2);
    expect(badOutcome.stdout).toContain("--outcome must be applied or not_applied");
    const noReason = await cli("recover", runId, "--invocation", invocationId, "--outcome", "not_applied");
    expect(noReason.code).toBe(2);
    expect(noReason.stdout).toContain("--reason is required");

    const resolved = await cli("recover", runId, "--invocation", invocationId, "--outcome", "not_applied", "--reason", "no k7 line on the remote");
    expect(resolved.code, resolved.stderr).toBe(0);
    expect(resolved.stdout).toContain(`invocation ${invocationId} (test.flaky_write.v1) resolved as not_applied by ${CLI_USER}`);
    expect(resolved.stdout).toMatch(new RegExp(`run ${runId} is (queued|running|succeeded)`));

    const run = await waitFor(runId, [RunStatus.SUCCEEDED, RunStatus.FAILED]);
    expect(run.finalReply).toBe("went on after recovery");
    const { steps: after } = await runs().listRunSteps({ runId });
    expect(after[0]?.toolInvocations[0]).toMatchObject({
      status: ToolInvocationStatus.UNKNOWN_OUTCOME,
      resolvedOutcome: ResolvedOutcome.NOT_APPLIED,
      resolvedByActorId: CLI_USER,
      resolutionReason: "no k7 line on the remote",
    });
    const inspected = await cli("inspect", runId);
    expect(inspected.stdout).toContain(`        resolved: not_applied by ${CLI_USER}: no k7 line on the remote`);

    const again = await cli("recover");
    expect(again.code).toBe(0);
    expect(again.stdout).not.toContain(runId);

    const twice = await cli("recover", runId, "--invocation", invocationId, "--outcome", "applied", "--reason", "again");
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain("(failed_precondition)");
  });

  it("resumes a paused run", async () => {
    const runId = await submit("cli-slow", "take your time");
    await waitFor(runId, [RunStatus.RUNNING]);
    await runs().pauseRun({ runId, actor: { id: "olivia" }, reason: "hold on" });
    const parked = await waitFor(runId, [RunStatus.QUEUED]);
    expect(parked.paused).toBe(true);
    const inspected = await cli("inspect", runId);
    expect(inspected.stdout).toMatch(/^status {7}queued \(paused/m);

    const resumed = await cli("resume", runId, "--reason", "carry on");
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toMatch(new RegExp(`^run ${runId} resumed by ${CLI_USER}; status (queued|running|succeeded)$`, "m"));
    const run = await waitFor(runId, [RunStatus.SUCCEEDED, RunStatus.FAILED]);
    expect(run.finalReply).toBe("resumed fine");
    expect(run.paused).toBe(false);

    const notPaused = await cli("resume", runId);
    expect(notPaused.code).toBe(1);
    expect(notPaused.stderr).toMatch(/already ended as succeeded \(failed_precondition\)/);
  });

  it("documents the new commands in its usage", async () => {
    const help = await cli("help");
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("keel resume RUN_ID [--reason R]");
    expect(help.stdout).toContain("keel recover RUN_ID --invocation ID --outcome applied|not_applied --reason R");
    const missing = await cli("resume");
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("resume needs a run id");
  });

  it("refuses a sandbox agent's disk quota too small to hold a workspace, naming the flag", async () => {
    const child = spawn(process.execPath, [KEEL_BIN, "sandbox-agent", "--token", "t", "--disk-quota-mib", "5"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    const code = await new Promise<number | null>((resolve) => child.once("close", resolve));
    expect(code).toBe(2);
    expect(stderr).toContain("--disk-quota-mib must be 0 (no quota) or 16 to 1048576 MiB per workspace");
  });
});
