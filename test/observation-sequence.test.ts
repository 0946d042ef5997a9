// The ledger numbers a call's observations (RunStore.observationLog): appends in flight side by
// side keep the order they were made in, and a call re-attached by another worker continues in a
// block of its own after everything observed; the result comes last. The fenced-out worker, still
// streaming, is refused by the fence: its late output never lands beside the new holder's.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

let markReattached!: () => void;
let lateRefused: unknown;
const reattached = new Promise<void>((resolve) => (markReattached = resolve));

/** A write that streams two chunks at once and never returns to its first worker; a re-attach streams one more. */
const streamingWrite = defineTool<Record<string, never>>({
  name: "test.streaming_write",
  version: 1,
  description: "A write whose output outlives its worker.",
  parameters: z.object({}),
  effect: "write",
  async execute(_args, context) {
    await Promise.all([context.observe("stdout", "first"), context.observe("stderr", "second")]);
    // Fenced out, the first worker's exec goes on writing after another worker re-attached.
    await reattached;
    await context.observe("stdout", "late").catch((error: unknown) => {
      lateRefused = error;
    });
    return new Promise((_, reject) => context.signal.addEventListener("abort", () => reject(new Error("stopped"))));
  },
  async reattach(_args, context) {
    await context.observe("stdout", "third");
    markReattached();
    return { ok: true, text: "done", exitCode: 0 };
  },
});

describe("observation sequence numbers", () => {
  let keel: TestKeel;
  beforeAll(async () => {
    keel = await startTestKeel({
      tools: [streamingWrite],
      agents: [scriptedAgent("streamer", [turn("", [{ toolName: "test.streaming_write.v1", argumentsJson: "{}" }]), turn("streamed")], { tools: toolGrants(["test.streaming_write.v1"]) })],
    });
  });
  afterAll(async () => {
    await keel.stop();
  });

  it("continue across a re-attach, in the order appended, with the result last", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { runId } = await ingress.submitMessage({ agentId: "streamer", conversationId: "c-1", actor: { id: "alice" }, messageId: "m-1", text: "go", connector: "seq-test" });
    const settled = async (statuses: RunStatus[]) => {
      for (let i = 0; i < 200; i++) {
        const { run } = await runs.getRun({ runId });
        if (run !== undefined && statuses.includes(run.status)) return run;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      throw new Error(`run ${runId} did not reach ${statuses.join(",")}`);
    };
    await settled([RunStatus.AWAITING_TOOL]);
    // Both chunks are in before the worker is fenced out.
    for (let i = 0; i < 100; i++) {
      const { steps } = await runs.listRunSteps({ runId });
      if ((steps[0]?.toolInvocations[0]?.observations.length ?? 0) >= 2) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await runs.requeueRun({ runId, actor: { id: "operator" }, reason: "worker looks stuck" });
    expect((await settled([RunStatus.SUCCEEDED, RunStatus.WAITING, RunStatus.FAILED])).status).toBe(RunStatus.SUCCEEDED);
    // The first worker tries to write "late" once the call was re-attached: the fence refuses it.
    for (let i = 0; i < 200 && lateRefused === undefined; i++) await new Promise((resolve) => setTimeout(resolve, 50));
    expect(lateRefused).toBeInstanceOf(LeaseLostError);
    const { steps } = await runs.listRunSteps({ runId });
    const observations = steps[0]?.toolInvocations[0]?.observations ?? [];
    const BLOCK = 1 << 20;
    expect(observations.map((o) => [o.seq, o.stream, o.text])).toEqual([
      [1, "stdout", "first"],
      [2, "stderr", "second"],
      [BLOCK, "stdout", "third"],
      [BLOCK + 1, "result", "done"],
    ]);
  });
});
