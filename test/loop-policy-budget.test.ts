// The loop's guard rails against a real server and scripted models: policy re-checked at
// dispatch, arguments checked against each tool's schema, every budget dimension ending a run
// legibly, and operators steering runs (cancel, pause/resume, unknown-outcome resolution).
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import {
  BudgetDimension,
  ResolvedOutcome,
  RunStatus,
  ToolInvocationStatus,
  WaitReason,
  type Run,
  type RunStep,
} from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { agentSpecToProto } from "../control-plane/src/api/agent-spec-convert.js";
import { withBudgetDefaults, type AgentSpec, type ModelSpec, type RunBudget, type ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { defineTool, type ToolDefinition } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { toolCall as call, scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools } from "./support/test-tools.js";


const GRANTED = ["test.echo.v1", "test.append_line.v1", "test.read_path.v1", "test.flaky_write.v1", "test.slow.v1"];

function agentWith(id: string, turns: ScriptedTurn[], overrides: Partial<AgentSpec> = {}, model: Partial<ModelSpec> = {}): AgentSpec {
  return scriptedAgent(id, turns, { tools: toolGrants(GRANTED), ...overrides }, model);
}

/** An agent whose one scripted turn calls test.echo.v1 and repeats forever: only a budget stops it. */
function foreverAgent(id: string, budget: Partial<RunBudget>, extra: Partial<ScriptedTurn> = {}, model: Partial<ModelSpec> = {}): AgentSpec {
  return agentWith(id, [turn("", [call("test.echo.v1", { text: "once more" })], extra)], { budget: withBudgetDefaults(budget) }, model);
}

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason as Error)), { once: true });
  });

/** Extra tools: a read that takes as long as it is told, and a write that hangs until its worker stops. */
function extraTools(): ToolDefinition[] {
  return [
    defineTool<{ ms: number }>({
      name: "test.slow",
      version: 1,
      description: "Sleeps for ms milliseconds (a read).",
      parameters: z.object({ ms: z.number().int().min(0).max(60_000) }),
      effect: "read",
      async execute(args, context) {
        await sleep(args.ms, context.signal);
        return { ok: true, text: `slept ${args.ms} ms` };
      },
    }),
    defineTool<{ key: string }>({
      name: "test.flaky_write",
      version: 1,
      description: "A write whose connection is lost: it never answers, until its worker shuts down.",
      parameters: z.object({ key: z.string() }),
      effect: "write",
      execute(_args, context) {
        return new Promise((_resolve, reject) => {
          const stop = () => reject(new Error(`lost connection: ${String(context.signal.reason)}`));
          if (context.signal.aborted) stop();
          else context.signal.addEventListener("abort", stop, { once: true });
        });
      },
    }),
  ];
}

const TERMINAL = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED];

/** Client helpers bound to one Keel. */
function harness(keel: () => TestKeel) {
  let n = 0;
  const ingress = () => connectClient(IngressService, keel().url, keel().tokens.connector);
  const runs = () => connectClient(RunService, keel().url, keel().tokens.operator);
  const emissions = () => connectClient(EmissionService, keel().url, keel().tokens.connector);

  return {
    ingress,
    runs,
    /** Submits on a connector of its own, so the run's emissions are easy to read back. */
    async submit(agentId: string, text = "please do the thing"): Promise<{ runId: string; connector: string }> {
      n += 1;
      const connector = `lpb-${n}-${Math.random().toString(36).slice(2, 8)}`;
      const { runId } = await ingress().submitMessage({
        agentId,
        conversationId: `c-${connector}`,
        actor: { id: "alice" },
        messageId: `m-${connector}`,
        text,
        connector,
      });
      return { runId, connector };
    },
    async waitFor(runId: string, statuses: readonly RunStatus[], timeoutMs = 20_000): Promise<Run> {
      const deadline = Date.now() + timeoutMs;
      let last: Run | undefined;
      while (Date.now() < deadline) {
        const { run } = await runs().getRun({ runId });
        last = run;
        if (run !== undefined && statuses.includes(run.status)) return run;
        await new Promise((r) => setTimeout(r, 25));
      }
      throw new Error(`run ${runId} did not reach ${statuses.map((s) => RunStatus[s]).join("|")}; last ${last === undefined ? "?" : RunStatus[last.status]} ${last?.error ?? ""}`);
    },
    async steps(runId: string): Promise<RunStep[]> {
      const all: RunStep[] = [];
      let pageToken = "";
      do {
        const page = await runs().listRunSteps({ runId, pageToken });
        all.push(...page.steps);
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      return all;
    },
    /** The run's emissions on its connector, up to and including the settled ack. */
    async emissionsOf(connector: string, runId: string): Promise<Emission[]> {
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(), 10_000);
      const seen: Emission[] = [];
      try {
        for await (const { emission } of emissions().subscribe({ connector }, { signal: abort.signal })) {
          if (emission === undefined || emission.runId !== runId) continue;
          seen.push(emission);
          if (emission.kind === EmissionKind.ACK && (emission.ackState === AckState.SUCCEEDED || emission.ackState === AckState.FAILED)) break;
        }
      } catch (error) {
        if (!abort.signal.aborted) throw error;
      } finally {
        clearTimeout(timer);
        abort.abort();
      }
      return seen;
    },
  };
}

/** The model request a step made, as the JSON text the ledger kept. */
const requestOf = (step: RunStep | undefined): string => step?.modelCall?.requestJson ?? "";

/** The tool results a step's request showed the model for the turn before it. */
function toolMessagesOf(step: RunStep | undefined): string[] {
  const messages = (JSON.parse(requestOf(step) || "{}") as { messages?: { role: string; content: string }[] }).messages ?? [];
  const lastTurn = messages.map((m) => m.role).lastIndexOf("assistant");
  return messages.slice(lastTurn + 1).filter((m) => m.role === "tool").map((m) => m.content);
}

let keel: TestKeel;
const h = harness(() => keel);

beforeAll(async () => {
  const effectsDir = await mkdtemp(path.join(tmpdir(), "keel-lpb-effects-"));
  keel = await startTestKeel({
    tools: [...createTestTools({ effectsDir }), ...extraTools()],
    // One worker stays stuck in test.flaky_write until the server stops; the rest keep going.
    workers: 4,
    agents: [
      agentWith("late-policy", [turn("", [call("test.echo.v1", { text: "hi" })], { delayMs: 1500 }), turn("finished without echo")]),
      agentWith(
        "path-rules",
        [
          turn("", [
            call("test.read_path.v1", { path: "/workspace/allowed/../secret" }),
            call("test.read_path.v1", { path: "/workspace/allowed/notes.txt" }),
          ]),
          turn("read what I could"),
        ],
        { policy: { kind: "restriction", allowedTools: [], allowedEffects: [], pathRules: [{ field: "path", prefixes: ["/workspace/allowed"] }], networkAccess: false } },
      ),
      agentWith("malformed", [
        turn("", [call("test.echo.v1", { txt: 1 }), call("test.echo.v1", { text: "fine" })]),
        turn("", [call("test.echo.v1", '{"text": "unterminated')]),
        turn("", [call("test.nope.v1", { text: "?" })]),
        turn("recovered"),
      ]),
      agentWith("hopeless", [turn("", [call("test.nope.v1", {})])]),
      // Budgets, one dimension each; the other limits stay at their (large) defaults.
      // A model call far slower than the whole run may take: the wall clock cuts it short.
      foreverAgent("wall-model", { maxWallClockMs: 500 }, { delayMs: 10_000 }),
      agentWith("wall-tool", [turn("", [call("test.slow.v1", { ms: 400 })])], { budget: withBudgetDefaults({ maxWallClockMs: 300 }) }),
      foreverAgent("iterations", { maxIterations: 3 }),
      foreverAgent("model-calls", { maxModelCalls: 2 }),
      foreverAgent("tool-calls", { maxToolCalls: 2 }),
      foreverAgent("input-tokens", { maxInputTokens: 250 }, { inputTokens: 100, outputTokens: 1 }),
      foreverAgent("output-tokens", { maxOutputTokens: 250 }, { inputTokens: 1, outputTokens: 100 }),
      foreverAgent("output-bytes", { maxOutputBytes: 150 }, { inputTokens: 1, outputTokens: 1 }),
      foreverAgent(
        "cost",
        { maxCostMicroUsd: 25_000 },
        { inputTokens: 1000, outputTokens: 100 },
        // 1000 input tokens at $8/Mtok and 100 output tokens at $20/Mtok: 10,000 µUSD a call.
        { prices: { inputMicroUsdPerMtok: 8_000_000, outputMicroUsdPerMtok: 20_000_000 } },
      ),
      // Operator steering.
      agentWith("slow-cancel", [turn("", [call("test.echo.v1", { text: "never" })], { delayMs: 1500 }), turn("should not be said")]),
      agentWith("slow-pause", [turn("", [call("test.echo.v1", { text: "before pause" })], { delayMs: 1500 }), turn("resumed and done")]),
      agentWith("asker", [turn("", [call("keel.ask_user.v1", { question: "Which colour?" })]), turn("painted")]),
      agentWith("flaky", [turn("", [call("test.flaky_write.v1", { key: "k9" })]), turn("done after the operator's word")]),
    ],
  });
});

afterAll(async () => {
  await keel?.stop();
});

describe("policy at dispatch", () => {
  it("refuses a call the policy stopped allowing while the model was thinking, tells the model, and finishes", async () => {
    const { runId } = await h.submit("late-policy");
    await h.waitFor(runId, [RunStatus.RUNNING]);
    // The worker already built its catalog (echo offered); now the admin narrows the policy.
    const original = (await keel.app.agents.get("late-policy"))!;
    const admin = connectClient(AgentService, keel.url, keel.tokens.admin);
    await admin.putAgent({
      agent: agentSpecToProto({
        ...original,
        policy: { kind: "restriction", allowedTools: ["test.read_path"], allowedEffects: [], pathRules: [], networkAccess: false },
      }),
    });

    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("finished without echo");
    expect(run.usage?.toolCalls).toBe(0);
    const steps = await h.steps(runId);
    expect(steps).toHaveLength(2);
    const refused = steps[0]!.toolInvocations[0]!;
    expect(refused).toMatchObject({ toolName: "test.echo.v1", status: ToolInvocationStatus.REFUSED });
    expect(refused.refusalReason).toContain('tool "test.echo.v1" is not among the allowed tools (test.read_path)');
    expect(refused.resultText).toBe("");
    // The tool was advertised on the first call and the refusal reached the model on the next.
    expect(requestOf(steps[0])).toContain("test.echo.v1");
    expect(toolMessagesOf(steps[1])).toEqual([`Refused: ${refused.refusalReason}`]);
  });

  it("refuses a path that escapes its prefix and runs the one inside it", async () => {
    const { runId } = await h.submit("path-rules");
    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("read what I could");
    const [first, second] = (await h.steps(runId))[0]!.toolInvocations;
    expect(first?.status).toBe(ToolInvocationStatus.REFUSED);
    expect(first?.refusalReason).toBe(
      'path field "path" value "/workspace/allowed/../secret" (which resolves to "/workspace/secret") is outside the allowed prefixes /workspace/allowed',
    );
    expect(second).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, resultText: "contents of /workspace/allowed/notes.txt" });
    expect(run.usage?.toolCalls).toBe(1);
    const steps = await h.steps(runId);
    expect(toolMessagesOf(steps[1])).toEqual([`Refused: ${first?.refusalReason ?? ""}`, "contents of /workspace/allowed/notes.txt"]);
  });
});

describe("malformed tool calls", () => {
  it("refuses schema mismatches, invalid JSON and unknown tools, shows the model why, and lets it recover", async () => {
    const { runId } = await h.submit("malformed");
    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status, run.error).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("recovered");
    const steps = await h.steps(runId);
    expect(steps).toHaveLength(4);

    // Turn 1: one call does not match the schema, its sibling runs.
    const [mismatch, fine] = steps[0]!.toolInvocations;
    expect(mismatch?.status).toBe(ToolInvocationStatus.REFUSED);
    expect(mismatch?.refusalReason).toMatch(/^the arguments do not match the schema of test\.echo\.v1: /);
    expect(mismatch?.refusalReason).toContain("text:");
    expect(mismatch?.refusalReason).toContain('"txt"');
    expect(fine).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, resultText: "echo: fine" });
    expect(toolMessagesOf(steps[1])).toEqual([`Refused: ${mismatch?.refusalReason ?? ""}`, "echo: fine"]);

    // Turn 2: arguments that are not JSON at all.
    const broken = steps[1]!.toolInvocations[0];
    expect(broken?.status).toBe(ToolInvocationStatus.REFUSED);
    expect(broken?.refusalReason).toMatch(/^the arguments are not valid JSON \(/);
    expect(toolMessagesOf(steps[2])).toEqual([`Refused: ${broken?.refusalReason ?? ""}`]);
    expect(requestOf(steps[2])).toContain("[keel] None of your tool calls could run");

    // Turn 3: a tool that does not exist.
    const unknown = steps[2]!.toolInvocations[0];
    expect(unknown?.status).toBe(ToolInvocationStatus.REFUSED);
    expect(unknown?.refusalReason).toMatch(/^there is no tool "test\.nope\.v1" in this run; available: .*test\.echo\.v1/);
    expect(toolMessagesOf(steps[3])).toEqual([`Refused: ${unknown?.refusalReason ?? ""}`]);
    expect(run.usage?.toolCalls).toBe(1);
  });

  it("fails the run legibly after three invalid turns in a row", async () => {
    const { runId, connector } = await h.submit("hopeless");
    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status).toBe(RunStatus.FAILED);
    expect(run.error).toContain("the model made 3 invalid turns in a row");
    expect(run.stepCount).toBe(3);
    const steps = await h.steps(runId);
    for (const step of steps) expect(step.toolInvocations[0]?.refusalReason).toContain('there is no tool "test.nope.v1"');
    const emitted = await h.emissionsOf(connector, runId);
    const reply = emitted.find((e) => e.kind === EmissionKind.REPLY);
    expect(reply?.text).toMatch(/^Sorry, I could not finish this: the model kept producing turns that could not be used/);
    expect(emitted.at(-1)).toMatchObject({ kind: EmissionKind.ACK, ackState: AckState.FAILED });
  });
});

describe("budgets", () => {
  const cases: readonly { agent: string; dimension: BudgetDimension; limit: string; check?: (run: Run, steps: RunStep[]) => void }[] = [
    {
      agent: "wall-model",
      dimension: BudgetDimension.WALL_CLOCK,
      limit: "the wall-clock budget (0.5 seconds)",
      check: (run, steps) => {
        // Cut off mid-call, not failed as a model error, and long before the model would have answered.
        expect(run.usage).toMatchObject({ modelCalls: 1, toolCalls: 0 });
        expect(Number(run.usage?.wallClockMs)).toBeGreaterThanOrEqual(500);
        expect(Number(run.usage?.wallClockMs)).toBeLessThan(5_000);
        expect(steps).toEqual([]);
        expect(run.finalReply).toContain("Done so far: nothing yet.");
      },
    },
    {
      agent: "wall-tool",
      dimension: BudgetDimension.WALL_CLOCK,
      limit: "the wall-clock budget (0.3 seconds)",
      check: (run) => {
        expect(run.usage?.toolCalls).toBe(1);
        expect(Number(run.usage?.wallClockMs)).toBeGreaterThanOrEqual(300);
      },
    },
    {
      agent: "iterations",
      dimension: BudgetDimension.ITERATIONS,
      limit: "the iteration budget (3 iterations)",
      check: (run) => expect(run.usage).toMatchObject({ iterations: 3, modelCalls: 3, toolCalls: 3 }),
    },
    {
      agent: "model-calls",
      dimension: BudgetDimension.MODEL_CALLS,
      limit: "the model-call budget (2 calls)",
      check: (run) => expect(run.usage).toMatchObject({ modelCalls: 2, toolCalls: 2 }),
    },
    {
      agent: "tool-calls",
      dimension: BudgetDimension.TOOL_CALLS,
      limit: "the tool-call budget (2 calls)",
      check: (run, steps) => {
        expect(run.usage).toMatchObject({ modelCalls: 3, toolCalls: 2 });
        // The third call was recorded, then refused at dispatch rather than run.
        expect(steps[2]?.toolInvocations[0]).toMatchObject({ status: ToolInvocationStatus.REFUSED, refusalReason: "not run: the run's tool calls budget is used up" });
      },
    },
    {
      agent: "input-tokens",
      dimension: BudgetDimension.INPUT_TOKENS,
      limit: "the input-token budget (250 tokens)",
      check: (run, steps) => {
        expect(run.usage?.inputTokens).toBe(300n);
        expect(run.usage?.toolCalls).toBe(2);
        // The overrunning turn's calls are committed as refused, never dispatched.
        expect(steps[2]?.toolInvocations[0]?.refusalReason).toBe("not run: the run's input tokens budget is used up");
      },
    },
    {
      agent: "output-tokens",
      dimension: BudgetDimension.OUTPUT_TOKENS,
      limit: "the output-token budget (250 tokens)",
      check: (run) => expect(run.usage?.outputTokens).toBe(300n),
    },
    {
      agent: "output-bytes",
      dimension: BudgetDimension.OUTPUT_BYTES,
      limit: "the output-size budget (150 bytes)",
      // Each "echo: once more" result adds 15 bytes; the turns themselves add none.
      check: (run) => expect(Number(run.usage?.outputBytes)).toBeGreaterThanOrEqual(150),
    },
    {
      agent: "cost",
      dimension: BudgetDimension.COST,
      limit: "the cost budget (0.025 USD)",
      check: (run, steps) => {
        expect(run.usage?.costMicroUsd).toBe(30_000n);
        expect(steps[0]?.modelCall?.costMicroUsd).toBe(10_000n);
      },
    },
  ];

  for (const c of cases) {
    it(`${c.agent}: ends budget_exhausted (${BudgetDimension[c.dimension]}) with a reply naming the limit`, async () => {
      const { runId, connector } = await h.submit(c.agent, "echo forever");
      const run = await h.waitFor(runId, TERMINAL);
      expect(run.status, run.error).toBe(RunStatus.BUDGET_EXHAUSTED);
      expect(run.exhaustedDimension).toBe(c.dimension);
      expect(run.error).toBe("");
      expect(run.finalReply).toContain(`I had to stop before finishing: this run used up ${c.limit}.`);
      expect(run.finalReply).toContain('Still to do: the rest of your request, "echo forever".');
      expect(run.finalReply).toContain("Reply yes to continue with a fresh budget.");
      const emitted = await h.emissionsOf(connector, runId);
      const replies = emitted.filter((e) => e.kind === EmissionKind.REPLY);
      expect(replies.map((e) => e.text)).toEqual([run.finalReply]);
      expect(replies[0]?.addressedActorIds).toEqual(["alice"]);
      expect(emitted.at(-1)).toMatchObject({ kind: EmissionKind.ACK, ackState: AckState.FAILED });
      c.check?.(run, await h.steps(runId));
    });
  }
});

describe("operators steering runs", () => {
  it("cancels a running run at its next safe point and records who did it", async () => {
    const { runId, connector } = await h.submit("slow-cancel");
    await h.waitFor(runId, [RunStatus.RUNNING]);
    const { run: asked } = await h.ingress().cancelRun({ runId, actor: { id: "carol" }, reason: "not needed any more" });
    // The model call is in flight: the request is recorded, the run stops at the next safe point.
    expect(asked?.status).toBe(RunStatus.RUNNING);
    expect(asked?.cancelledByActorId).toBe("carol");

    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status).toBe(RunStatus.CANCELLED);
    expect(run.cancelledByActorId).toBe("carol");
    expect(run.usage?.toolCalls).toBe(0);
    const steps = await h.steps(runId);
    expect(steps).toHaveLength(1);
    expect(steps[0]?.toolInvocations[0]).toMatchObject({
      status: ToolInvocationStatus.REFUSED,
      refusalReason: "not run: the run was cancelled by carol",
    });
    const emitted = await h.emissionsOf(connector, runId);
    expect(emitted.filter((e) => e.kind === EmissionKind.REPLY)).toEqual([]);
    expect(emitted.at(-1)).toMatchObject({ kind: EmissionKind.ACK, ackState: AckState.FAILED });
  });

  it("cancels a run awaiting input at once", async () => {
    const { runId } = await h.submit("asker");
    await h.waitFor(runId, [RunStatus.AWAITING_INPUT]);
    const { run } = await h.ingress().cancelRun({ runId, actor: { id: "carol" }, reason: "never mind" });
    expect(run?.status).toBe(RunStatus.CANCELLED);
    expect(run?.cancelledByActorId).toBe("carol");
    expect(run?.finishedAt).toBeDefined();
    await expect(h.ingress().cancelRun({ runId, actor: { id: "carol" }, reason: "again" })).rejects.toThrow(/already ended as cancelled/);
  });

  it("pauses a run at its next safe point, keeps it queued while paused, and resumes it to success", async () => {
    const { runId } = await h.submit("slow-pause");
    await h.waitFor(runId, [RunStatus.RUNNING]);
    const { run: asked } = await h.runs().pauseRun({ runId, actor: { id: "olivia" }, reason: "hold on" });
    expect(asked).toMatchObject({ status: RunStatus.RUNNING, paused: true });

    // The in-flight turn and its tool call finish; the worker hands the run back at the checkpoint.
    const parked = await h.waitFor(runId, [RunStatus.QUEUED, ...TERMINAL]);
    expect(parked).toMatchObject({ status: RunStatus.QUEUED, paused: true, waitReason: WaitReason.PAUSED, stepCount: 1 });
    await new Promise((r) => setTimeout(r, 1000));
    expect((await h.runs().getRun({ runId })).run).toMatchObject({ status: RunStatus.QUEUED, paused: true, stepCount: 1 });

    const { run: resumed } = await h.runs().resumeRun({ runId, actor: { id: "olivia" }, reason: "go on" });
    expect(resumed).toMatchObject({ paused: false, waitReason: WaitReason.UNSPECIFIED });
    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status, run.error).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("resumed and done");
    expect(run.usage).toMatchObject({ modelCalls: 2, toolCalls: 1 });
  });

  it("recovers a write lost with its worker as unknown_outcome, waits, and continues once an operator resolves it", async () => {
    const { runId } = await h.submit("flaky");
    await h.waitFor(runId, [RunStatus.AWAITING_TOOL]);
    // The write hangs; the operator hands the run back, fencing out the stuck worker.
    const { run: requeued } = await h.runs().requeueRun({ runId, actor: { id: "olivia" }, reason: "worker stuck on a write" });
    // Read after the requeue committed: another worker may already have claimed the run again.
    expect([RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING]).toContain(requeued?.status);

    const waiting = await h.waitFor(runId, [RunStatus.WAITING, ...TERMINAL]);
    expect(waiting).toMatchObject({ status: RunStatus.WAITING, waitReason: WaitReason.UNKNOWN_WRITE_OUTCOME });
    let steps = await h.steps(runId);
    const lost = steps[0]!.toolInvocations[0]!;
    expect(lost).toMatchObject({ toolName: "test.flaky_write.v1", status: ToolInvocationStatus.UNKNOWN_OUTCOME, resolvedOutcome: ResolvedOutcome.UNSPECIFIED });
    // A waiting run cannot be requeued around the operator's decision.
    await expect(h.runs().requeueRun({ runId, actor: { id: "olivia" }, reason: "skip it" })).rejects.toThrow(/resolve its unknown outcome/);

    const resolved = await h.runs().resolveUnknownOutcome({
      runId,
      toolInvocationId: lost.id,
      outcome: ResolvedOutcome.NOT_APPLIED,
      actor: { id: "dave" },
      reason: "the remote has no k9 line",
    });
    expect(resolved.toolInvocation).toMatchObject({
      status: ToolInvocationStatus.UNKNOWN_OUTCOME,
      resolvedOutcome: ResolvedOutcome.NOT_APPLIED,
      resolvedByActorId: "dave",
      resolutionReason: "the remote has no k9 line",
    });
    // Requeued by the resolution; read after its commit, so a worker may already have it again.
    expect([RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_TOOL, RunStatus.SUCCEEDED]).toContain(resolved.run?.status);
    // Resolved once is resolved for good (or the run has already finished, which also refuses).
    await expect(
      h.runs().resolveUnknownOutcome({ runId, toolInvocationId: lost.id, outcome: ResolvedOutcome.APPLIED, actor: { id: "dave" }, reason: "twice" }),
    ).rejects.toThrow(/no unresolved unknown outcome|already ended as succeeded/);

    const run = await h.waitFor(runId, TERMINAL);
    expect(run.status, run.error).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("done after the operator's word");
    steps = await h.steps(runId);
    expect(steps).toHaveLength(2);
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ resolvedOutcome: ResolvedOutcome.NOT_APPLIED, resolvedByActorId: "dave" });
    expect(toolMessagesOf(steps[1])).toEqual([
      "Outcome was unknown after a worker stopped; dave determined it did not take effect: the remote has no k9 line",
    ]);
  });
});

describe("operators steering runs no worker holds", () => {
  let idle: TestKeel;
  const i = harness(() => idle);
  beforeAll(async () => {
    idle = await startTestKeel({ workers: 0, agents: [agentWith("parked", [turn("never runs")])] });
  });
  afterAll(async () => {
    await idle?.stop();
  });

  it("pauses and resumes a queued run", async () => {
    const { runId } = await i.submit("parked");
    const { run: paused } = await i.runs().pauseRun({ runId, actor: { id: "olivia" }, reason: "maintenance" });
    expect(paused).toMatchObject({ status: RunStatus.QUEUED, paused: true, waitReason: WaitReason.PAUSED });
    await expect(i.runs().pauseRun({ runId, actor: { id: "olivia" }, reason: "again" })).resolves.toBeDefined();
    const { run: resumed } = await i.runs().resumeRun({ runId, actor: { id: "olivia" }, reason: "done" });
    expect(resumed).toMatchObject({ status: RunStatus.QUEUED, paused: false, waitReason: WaitReason.UNSPECIFIED });
    await expect(i.runs().resumeRun({ runId, actor: { id: "olivia" }, reason: "twice" })).rejects.toThrow(/is not paused/);
  });

  it("keeps a paused run's reason when an operator requeues it", async () => {
    const { runId } = await i.submit("parked");
    await i.runs().pauseRun({ runId, actor: { id: "olivia" }, reason: "maintenance" });
    const { run } = await i.runs().requeueRun({ runId, actor: { id: "olivia" }, reason: "fresh lease" });
    expect(run).toMatchObject({ status: RunStatus.QUEUED, paused: true, waitReason: WaitReason.PAUSED });
  });

  it("cancels a queued run at once", async () => {
    const { runId, connector } = await i.submit("parked");
    const { run } = await i.ingress().cancelRun({ runId, actor: { id: "carol" }, reason: "wrong channel" });
    expect(run).toMatchObject({ status: RunStatus.CANCELLED, cancelledByActorId: "carol" });
    const emitted = await i.emissionsOf(connector, runId);
    expect(emitted.map((e) => [e.kind, e.ackState])).toEqual([
      [EmissionKind.ACK, AckState.WORKING],
      [EmissionKind.ACK, AckState.FAILED],
    ]);
  });
});
