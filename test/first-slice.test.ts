import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunEventKind, RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

describe("first slice: one message, one model call, one reply", () => {
  let keel: TestKeel;
  beforeAll(async () => {
    keel = await startTestKeel();
  });
  afterAll(async () => {
    await keel.stop();
  });

  async function collect(connector: string, until: (e: Emission[]) => boolean): Promise<Emission[]> {
    const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
    const seen: Emission[] = [];
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 10_000);
    try {
      for await (const { emission } of emissions.subscribe({ connector }, { signal: abort.signal })) {
        if (emission !== undefined) seen.push(emission);
        if (until(seen)) break;
      }
    } finally {
      clearTimeout(timer);
      abort.abort();
    }
    return seen;
  }

  it("replies through the emission stream and records the step", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const submitted = await ingress.submitMessage({
      agentId: "demo",
      conversationId: "c-1",
      actor: { id: "alice", displayName: "Alice" },
      messageId: "m-1",
      text: "ping",
      connector: "slice-test",
    });
    expect(submitted.status).toBe(RunStatus.QUEUED);
    expect(submitted.duplicate).toBe(false);

    const emissions = await collect("slice-test", (seen) => seen.some((e) => e.kind === EmissionKind.ACK && e.ackState === AckState.SUCCEEDED));
    expect(emissions.map((e) => [e.kind, e.ackState])).toEqual([
      [EmissionKind.ACK, AckState.WORKING],
      [EmissionKind.ACK, AckState.STARTED],
      [EmissionKind.ACK, AckState.THINKING],
      [EmissionKind.REPLY, 0],
      [EmissionKind.ACK, AckState.SUCCEEDED],
    ]);
    const reply = emissions[3]!;
    expect(reply.text).toBe("Hello from Keel. You said: ping");
    expect(reply.runId).toBe(submitted.runId);
    expect(reply.replyToMessageId).toBe("m-1");
    expect(reply.addressedActorIds).toEqual(["alice"]);
    expect(emissions.map((e) => Number(e.seq))).toEqual([...emissions.map((e) => Number(e.seq))].sort((a, b) => a - b));

    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { run } = await runs.getRun({ runId: submitted.runId });
    expect(run?.status).toBe(RunStatus.SUCCEEDED);
    expect(run?.finalReply).toBe(reply.text);
    expect(run?.triggers.map((t) => [t.messageId, t.actorId])).toEqual([["m-1", "alice"]]);
    const { steps } = await runs.listRunSteps({ runId: submitted.runId });
    expect(steps).toHaveLength(1);
    expect(steps[0]?.modelCall?.responseText).toBe(reply.text);
    expect(Number(steps[0]?.modelCall?.usage?.inputTokens)).toBeGreaterThan(0);
    expect((JSON.parse(steps[0]!.modelCall!.requestJson) as { messages: unknown[] }).messages.at(-1)).toMatchObject({ role: "user", content: "ping" });
    const { step } = await runs.getRunStep({ runId: submitted.runId, stepId: steps[0]!.id });
    expect(step?.id).toBe(steps[0]!.id);

    const events = [];
    for await (const { event } of runs.watchRun({ runId: submitted.runId })) events.push(event);
    expect(events.map((e) => e?.kind)).toEqual([
      RunEventKind.CREATED,
      RunEventKind.STATUS_CHANGED,
      RunEventKind.STEP_COMMITTED,
      RunEventKind.STATUS_CHANGED,
    ]);
    expect(events.map((e) => Number(e?.seq))).toEqual([1, 2, 3, 4]);
    const resumed = [];
    for await (const { event } of runs.watchRun({ runId: submitted.runId, afterSeq: 2n })) resumed.push(Number(event?.seq));
    expect(resumed).toEqual([3, 4]);
  });

  it("is idempotent on the message id", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const request = { agentId: "demo", conversationId: "c-2", actor: { id: "bob" }, messageId: "m-dup", text: "once", connector: "dup-test" };
    const [first, second] = await Promise.all([ingress.submitMessage(request), ingress.submitMessage(request)]);
    expect(first.runId).toBe(second.runId);
    expect([first.duplicate, second.duplicate].sort()).toEqual([false, true]);
    const third = await ingress.submitMessage(request);
    expect(third).toMatchObject({ runId: first.runId, duplicate: true });
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const { runs: listed } = await runs.listRuns({ agentId: "demo", conversationId: "c-2" });
    expect(listed).toHaveLength(1);
  });
});

describe("plain HTTP endpoints", () => {
  let keel: TestKeel;
  beforeAll(async () => {
    keel = await startTestKeel({ workers: 0 });
  });
  afterAll(async () => {
    await keel.stop();
  });

  it("serves health and Prometheus metrics read from the ledger", async () => {
    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    await ingress.submitMessage({ agentId: "demo", conversationId: "m", actor: { id: "a" }, messageId: "m1", text: "hi", connector: "metrics" });
    expect(await (await fetch(`${keel.http1Url}/healthz`)).text()).toBe("ok\n");
    // The scrape needs an operator's token; without one it is refused.
    expect((await fetch(`${keel.http1Url}/metrics`)).status).toBe(401);
    const metrics = await (await fetch(`${keel.http1Url}/metrics`, { headers: { authorization: `Bearer ${keel.tokens.operator}` } })).text();
    expect(metrics).toContain('keel_runs{status="queued"} 1');
    expect(metrics).toMatch(/^keel_oldest_queued_run_age_seconds \d+\.\d{3}$/m);
    expect(metrics).toContain("keel_unresolved_unknown_outcomes 0");
  });
});
