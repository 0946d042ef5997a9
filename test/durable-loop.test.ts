import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus, Replayability, CommitBoundary } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";
import { z } from "zod";
import { defineTool, ToolOutcomeUnknownError } from "../control-plane/src/tools/tool-registry.js";

/** Tools whose executor loses track of the call, and one that can be re-attached after a requeue. */
function lostTools(reattached: { calls: number }) {
  return [
    defineTool<Record<string, never>>({
      name: "test.lost_read",
      version: 1,
      description: "A read whose host vanishes mid-call.",
      parameters: z.object({}),
      effect: "read",
      execute: () => Promise.reject(new ToolOutcomeUnknownError("the sandbox host went away")),
    }),
    defineTool<Record<string, never>>({
      name: "test.lost_write",
      version: 1,
      description: "A write whose host vanishes mid-call.",
      parameters: z.object({}),
      effect: "write",
      execute: () => Promise.reject(new ToolOutcomeUnknownError("the sandbox host went away")),
    }),
    defineTool<Record<string, never>>({
      name: "test.reattachable_write",
      version: 1,
      description: "A write that never returns to its first worker but can be re-attached to.",
      parameters: z.object({}),
      effect: "write",
      execute: (_args, context) => new Promise((_, reject) => context.signal.addEventListener("abort", () => reject(new Error("stopped")))),
      reattach() {
        reattached.calls += 1;
        return Promise.resolve({ ok: true, text: "finished while nobody watched", exitCode: 0 });
      },
    }),
  ];
}


function agentWith(id: string, turns: ScriptedTurn[], overrides: Partial<AgentSpec> = {}): AgentSpec {
  return scriptedAgent(id, turns, { tools: toolGrants(["test.echo.v1", "test.append_line.v1", "test.read_path.v1"]), ...overrides });
}

describe("the durable loop", () => {
  let keel: TestKeel;
  let effectsDir: string;
  const reattached = { calls: 0 };
  beforeAll(async () => {
    effectsDir = await mkdtemp(path.join(tmpdir(), "keel-effects-"));
    keel = await startTestKeel({
      tools: [...createTestTools({ effectsDir }), ...lostTools(reattached)],
      agents: [
        agentWith("multi", [
          turn("", [{ toolName: "test.echo.v1", argumentsJson: '{"text":"look"}' }]),
          turn("", [{ toolName: "test.append_line.v1", argumentsJson: '{"key":"k1"}' }]),
          turn("all done"),
        ]),
        agentWith("asker", [turn("", [{ toolName: "keel.ask_user.v1", argumentsJson: '{"question":"Which colour?"}' }]), turn("painted it")]),
        agentWith("loser", [turn("", [{ toolName: "test.lost_read.v1", argumentsJson: "{}" }]), turn("", [{ toolName: "test.lost_write.v1", argumentsJson: "{}" }]), turn("never")], {
          tools: ["test.lost_read.v1", "test.lost_write.v1"].map((toolName) => ({ toolName, connectors: [], readOnlyCommands: [] })),
        }),
        agentWith("reattacher", [turn("", [{ toolName: "test.reattachable_write.v1", argumentsJson: "{}" }]), turn("saw it")], {
          tools: [{ toolName: "test.reattachable_write.v1", connectors: [], readOnlyCommands: [] }],
        }),
      ],
    });
  });
  afterAll(async () => {
    await keel.stop();
  });

  async function submitAndSettle(agentId: string, text: string, conversationId = `c-${Math.random()}`): Promise<string> {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const { runId } = await ingress.submitMessage({ agentId, conversationId, actor: { id: "alice" }, messageId: `m-${Math.random()}`, text, connector: "loop-test" });
    return runId;
  }

  async function waitFor(runId: string, statuses: RunStatus[]): Promise<NonNullable<Awaited<ReturnType<ReturnType<typeof connectClient<typeof RunService>>["getRun"]>>["run"]>> {
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    for (let i = 0; i < 200; i++) {
      const { run } = await runs.getRun({ runId });
      if (run !== undefined && statuses.includes(run.status)) return run;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`run ${runId} did not reach ${statuses.join(",")}`);
  }

  it("runs several tool calls, one committed step each, and crosses the commit boundary on the write", async () => {
    const runId = await submitAndSettle("multi", "do the thing");
    const run = await waitFor(runId, [RunStatus.SUCCEEDED, RunStatus.FAILED]);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("all done");
    expect(run.commitBoundary).toBe(CommitBoundary.COMMITTED);
    expect(run.usage?.toolCalls).toBe(2);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { steps } = await runs.listRunSteps({ runId });
    expect(steps.map((s) => s.replayability)).toEqual([Replayability.REPLAYABLE, Replayability.NOT_REPLAYABLE, Replayability.REPLAYABLE]);
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ toolName: "test.echo.v1", status: ToolInvocationStatus.SUCCEEDED, resultText: "echo: look" });
    expect(steps[0]?.toolInvocations[0]?.observations.map((o) => o.stream)).toEqual(["stdout", "result"]);
    expect(steps[1]?.toolInvocations[0]).toMatchObject({ toolName: "test.append_line.v1", status: ToolInvocationStatus.SUCCEEDED });
    const secondRequest = JSON.parse(steps[1]!.modelCall!.requestJson) as { messages: { role: string; content: string }[] };
    expect(secondRequest.messages.at(-1)).toMatchObject({ role: "tool", content: "echo: look" });
    expect(writesRecorded(effectsDir).filter((l) => l.endsWith(" k1"))).toHaveLength(1);
    const { artifacts } = await runs.listArtifacts({ runId });
    expect(artifacts.map((a) => [a.type, a.inlineData])).toEqual([["line", "k1"]]);
  });

  it("parks in awaiting_input on keel.ask_user and resumes when anyone in the conversation answers", async () => {
    const runId = await submitAndSettle("asker", "paint the fence");
    await waitFor(runId, [RunStatus.AWAITING_INPUT]);
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const answered = await ingress.answerInput({ runId, actor: { id: "bob" }, text: "blue" });
    expect(answered.status).toBe(RunStatus.QUEUED);
    const run = await waitFor(runId, [RunStatus.SUCCEEDED, RunStatus.FAILED]);
    expect(run.finalReply).toBe("painted it");
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { steps } = await runs.listRunSteps({ runId });
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ toolName: "keel.ask_user.v1", resultText: "Answer from bob: blue" });
    expect(steps[1]?.actorId).toBe("bob");
  });

  it("treats a call whose host vanished like a dead worker's: the read is interrupted, the write waits", async () => {
    const runId = await submitAndSettle("loser", "go");
    const run = await waitFor(runId, [RunStatus.WAITING, RunStatus.SUCCEEDED, RunStatus.FAILED]);
    expect(run.status).toBe(RunStatus.WAITING);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { steps } = await runs.listRunSteps({ runId });
    expect(steps.map((s) => s.toolInvocations[0]?.status)).toEqual([ToolInvocationStatus.INTERRUPTED, ToolInvocationStatus.UNKNOWN_OUTCOME]);
    const secondRequest = JSON.parse(steps[1]!.modelCall!.requestJson) as { messages: { role: string; content: string }[] };
    expect(secondRequest.messages.at(-1)?.content).toMatch(/^Interrupted:/);
  });

  it("re-attaches to a call that outlived its worker and commits its real outcome", async () => {
    const runId = await submitAndSettle("reattacher", "go");
    await waitFor(runId, [RunStatus.AWAITING_TOOL]);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    await runs.requeueRun({ runId, actor: { id: "operator" }, reason: "worker looks stuck" });
    const run = await waitFor(runId, [RunStatus.SUCCEEDED, RunStatus.WAITING, RunStatus.FAILED]);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(reattached.calls).toBe(1);
    const { steps } = await runs.listRunSteps({ runId });
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, resultText: "finished while nobody watched" });
  });
});
