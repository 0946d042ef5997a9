// ListRunSteps under issue #12 (items 11, 12): a page holds at most about half the server's message
// limit of records, read within that budget (a step with more output continues on the next page,
// each observation sent once, in order), and a page token it did not issue is InvalidArgument.
import { randomUUID } from "node:crypto";
import { Code, ConnectError } from "@connectrpc/connect";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunService, RunStepView, type ListRunStepsResponse } from "../gen/keel/v1/run_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { connectClient, grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedToolCall } from "./support/run-seed.js";

const MAX_MESSAGE_BYTES = 512 * 1024;
const CHUNK = 100 * 1024;

describe("ListRunSteps paging", () => {
  let keel: TestKeel;
  let db: pg.Client;
  const runId = randomUUID();
  /** Every observation id the run has, per invocation, in seq order. */
  const expected = new Map<string, string[]>();
  const stepIds: string[] = [];

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 0, env: { KEEL_MAX_MESSAGE_BYTES: String(MAX_MESSAGE_BYTES) } });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    const conversationId = randomUUID();
    await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, 'paging', 'test')", [conversationId, DEMO_AGENT.id]);
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, finished_at)
       VALUES ($1, $2, $3, 'test', 'succeeded', 'someone', '{}', '{}', now())`,
      [runId, DEMO_AGENT.id, conversationId],
    );
    // 1.4 MB of output in step 0, a quiet step 1, and two calls of 0.5 MB each in step 2: three times the message limit.
    const shape = [[14], [0], [5, 5]];
    for (const [index, calls] of shape.entries()) {
      const stepId = randomUUID();
      stepIds.push(stepId);
      await db.query(
        "INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at) VALUES ($1, $2, $3, 'replayable', 'running', 1, now())",
        [stepId, runId, index],
      );
      for (const [ordinal, chunks] of calls.entries()) {
        const texts = Array.from({ length: chunks }, (_, i) => `${String.fromCharCode(97 + i)}`.repeat(CHUNK));
        const seeded = await seedToolCall(db, { runId, stepId, ordinal, observations: texts });
        expected.set(seeded.invocationId, [...seeded.observationIds]);
      }
    }
  });
  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });

  it("pages a run with three times the message limit of output, each observation once and in order", async () => {
    for (const client of [connectClient(RunService, keel.url, keel.tokens.operator), grpcClient(RunService, keel.url, keel.tokens.operator)]) {
      const seen = new Map<string, string[]>();
      const stepsSeen: string[] = [];
      let pageToken = "";
      let pages = 0;
      do {
        const page: ListRunStepsResponse = await client.listRunSteps({ runId, pageToken, pageSize: 500 });
        let bytes = 0;
        for (const step of page.steps) {
          if (stepsSeen.at(-1) !== step.id) stepsSeen.push(step.id);
          for (const invocation of step.toolInvocations) {
            const list = seen.get(invocation.id) ?? [];
            for (const observation of invocation.observations) {
              list.push(observation.id);
              bytes += observation.text.length;
            }
            seen.set(invocation.id, list);
          }
        }
        expect(bytes).toBeLessThanOrEqual(MAX_MESSAGE_BYTES / 2);
        pageToken = page.nextPageToken;
        pages++;
      } while (pageToken !== "" && pages < 50);
      expect(pageToken).toBe("");
      expect(stepsSeen).toEqual(stepIds);
      expect(seen).toEqual(expected);
      // 2.4 MB at under 256 KiB a page.
      expect(pages).toBeGreaterThanOrEqual(10);
    }
  });

  it("lists and gets summaries, without requests, arguments, results or output, paged by page_size alone", async () => {
    for (const client of [connectClient(RunService, keel.url, keel.tokens.operator), grpcClient(RunService, keel.url, keel.tokens.operator)]) {
      // 2.4 MB of output would take ten full pages; summaries of all three steps fit in one.
      const all = await client.listRunSteps({ runId, pageSize: 500, view: RunStepView.SUMMARY });
      expect(all.nextPageToken).toBe("");
      expect(all.steps.map((step) => step.id)).toEqual(stepIds);
      const invocations = all.steps.flatMap((step) => step.toolInvocations);
      expect(invocations.map((invocation) => invocation.id).sort()).toEqual([...expected.keys()].sort());
      for (const invocation of invocations) {
        expect(invocation.toolName).not.toBe("");
        expect([invocation.observations.length, invocation.argumentsJson, invocation.resultText]).toEqual([0, "", ""]);
      }
      // page_size still pages them, and the tokens go on where the last page ended.
      const first = await client.listRunSteps({ runId, pageSize: 2, view: RunStepView.SUMMARY });
      const rest = await client.listRunSteps({ runId, pageSize: 2, pageToken: first.nextPageToken, view: RunStepView.SUMMARY });
      expect([...first.steps, ...rest.steps].map((step) => step.id)).toEqual(stepIds);
      expect(rest.nextPageToken).toBe("");
      // GetRunStep's summary of step 0, whose 1.4 MB of output no reply carries whole.
      const whole = await client.getRunStep({ runId, stepId: stepIds[0]! }).then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
      expect(whole?.code).toBe(Code.ResourceExhausted);
      const summary = await client.getRunStep({ runId, stepId: stepIds[0]!, view: RunStepView.SUMMARY });
      expect(summary.step?.toolInvocations.map((invocation) => [invocation.id, invocation.observations.length])).toEqual([[[...expected.keys()][0], 0]]);
    }
  });

  it("refuses a view that is not a RunStepView as InvalidArgument naming view", async () => {
    const refused = await connectClient(RunService, keel.url, keel.tokens.operator)
      .listRunSteps({ runId, view: 7 as RunStepView })
      .then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
    expect(refused?.code).toBe(Code.InvalidArgument);
    expect(refused?.rawMessage).toMatch(/^view: /);
  });

  it("refuses a page token it did not issue as InvalidArgument naming page_token", async () => {
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const garbage = ["not a token", Buffer.from("banana").toString("base64url"), Buffer.from("within:1:x:2").toString("base64url"), "%%%"];
    for (const pageToken of garbage) {
      const refused = await runs.listRunSteps({ runId, pageToken }).then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
      expect(refused?.code, pageToken).toBe(Code.InvalidArgument);
      expect(refused?.rawMessage).toMatch(/^page_token: /);
    }
  });
});

describe("GetRunStep of a step larger than a reply", () => {
  it("is refused as ResourceExhausted before its records are loaded, pointing at ListRunSteps", async () => {
    const keel = await startTestKeel({ workers: 0, env: { KEEL_MAX_MESSAGE_BYTES: String(256 * 1024) } });
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      const conversationId = randomUUID();
      const runId = randomUUID();
      const stepId = randomUUID();
      await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
      await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, 'big-step', 'test')", [conversationId, DEMO_AGENT.id]);
      await db.query(
        "INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage) VALUES ($1, $2, $3, 'test', 'succeeded', 'someone', '{}', '{}')",
        [runId, DEMO_AGENT.id, conversationId],
      );
      await db.query(
        "INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at) VALUES ($1, $2, 0, 'replayable', 'running', 1, now())",
        [stepId, runId],
      );
      await seedToolCall(db, { runId, stepId, observations: ["x".repeat(200 * 1024), "y".repeat(200 * 1024)] });
      const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
      const refused = await runs.getRunStep({ runId, stepId }).then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
      expect(refused?.code).toBe(Code.ResourceExhausted);
      expect(refused?.rawMessage).toMatch(/ListRunSteps pages it/);
    } finally {
      await db.end();
      await keel.stop();
    }
  });
});

describe("ListRunSteps of a long transcript stored as deltas", () => {
  it("fits each page to the message limit with every request expanded whole, each step once", async () => {
    const limit = 512 * 1024;
    const keel = await startTestKeel({ workers: 0, env: { KEEL_MAX_MESSAGE_BYTES: String(limit) } });
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      const conversationId = randomUUID();
      const runId = randomUUID();
      await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
      await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, 'deltas', 'test')", [conversationId, DEMO_AGENT.id]);
      await db.query(
        "INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage) VALUES ($1, $2, $3, 'test', 'succeeded', 'someone', '{}', '{}')",
        [runId, DEMO_AGENT.id, conversationId],
      );
      // Each call adds a 16 KiB message to the one before: stored, a step is 16 KiB; expanded,
      // step k is (k + 1) × 16 KiB, 1.2 MiB over the run, far past one reply.
      const steps = 12;
      const stepIds: string[] = [];
      let previous: string | undefined;
      for (let index = 0; index < steps; index++) {
        const stepId = randomUUID();
        const callId = randomUUID();
        stepIds.push(stepId);
        const message = { role: index % 2 === 0 ? "user" : "assistant", content: String.fromCharCode(97 + index).repeat(16 * 1024) };
        const request = previous === undefined ? { messages: [message], tools: [] } : { base: previous, keep: index, messages: [message] };
        await db.query(
          `INSERT INTO run_steps (id, run_id, index, replayability, run_status_after, lease_epoch, started_at, call_id, call_role, call_provider,
             call_model, call_request, call_response_text, call_tool_calls, call_input_tokens, call_output_tokens, call_latency_ms, call_finish_reason)
           VALUES ($1, $2, $3, 'replayable', 'running', 1, now(), $4, 'primary', 'scripted', 'scripted', $5, 'ok', '[]', 1, 1, 1, 'stop')`,
          [stepId, runId, index, callId, JSON.stringify(request)],
        );
        previous = callId;
      }
      for (const client of [connectClient(RunService, keel.url, keel.tokens.operator), grpcClient(RunService, keel.url, keel.tokens.operator)]) {
        const seen: string[] = [];
        let pageToken = "";
        let pages = 0;
        do {
          const page: ListRunStepsResponse = await client.listRunSteps({ runId, pageToken, pageSize: 500 });
          for (const step of page.steps) {
            seen.push(step.id);
            // Whole: the step's request holds every message so far, the newest last.
            const messages = (JSON.parse(step.modelCall?.requestJson ?? "{}") as { messages: { content: string }[] }).messages;
            expect(messages).toHaveLength(step.index + 1);
            expect(messages.at(-1)?.content[0]).toBe(String.fromCharCode(97 + step.index));
          }
          pageToken = page.nextPageToken;
          pages++;
        } while (pageToken !== "" && pages < 50);
        expect(seen).toEqual(stepIds);
        expect(pages).toBeGreaterThanOrEqual(4);
      }
    } finally {
      await db.end();
      await keel.stop();
    }
  });
});
