// RunService.CancelRun and ForkRun over a real server, through two unrelated clients: @grpc/grpc-js
// loading only the .proto files (as an operator tool in another language would), and Connect-ES.
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, type Run, type RunStep } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { toolCall as call, scriptedAgent, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { FORK_CONNECTOR } from "../control-plane/src/ledger/run-fork.repository.js";
import { connectClient, grpcJsClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools } from "./support/test-tools.js";

/** The parts of a Run the assertions read, in one shape for both clients. */
interface RunView {
  readonly id: string;
  readonly status: string;
  readonly cancelledByActorId: string;
  readonly forkedFromRunId: string;
  readonly forkedAtStep: number;
  readonly forkReason: string;
  readonly forkRunIds: readonly string[];
  readonly connector: string;
  readonly conversationId: string;
}

interface OperatorClient {
  readonly name: string;
  cancelRun(request: { runId: string; actorId: string; reason: string }): Promise<RunView>;
  forkRun(request: { runId: string; stepIndex: number; actorId: string; reason: string }): Promise<RunView>;
  close(): void;
}

/** A refusal as both clients report it: gRPC status numbers and Connect codes are the same numbers. */
class Refusal extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

const statusName = (status: RunStatus): string => `RUN_STATUS_${RunStatus[status]}`;

function viewOfConnect(run: Run | undefined): RunView {
  if (run === undefined) throw new Error("no run in the response");
  return { ...run, status: statusName(run.status), forkRunIds: [...run.forkRunIds] };
}

function connectOperator(keel: TestKeel): OperatorClient {
  const client = connectClient(RunService, keel.url, keel.tokens.operator);
  const refusal = (error: unknown) => {
    const e = ConnectError.from(error);
    return new Refusal(e.code, e.rawMessage);
  };
  return {
    name: "Connect-ES",
    cancelRun: ({ runId, actorId, reason }) =>
      client.cancelRun({ runId, actor: { id: actorId }, reason }).then((r) => viewOfConnect(r.run), (e: unknown) => Promise.reject(refusal(e))),
    forkRun: ({ runId, stepIndex, actorId, reason }) =>
      client.forkRun({ runId, stepIndex, actor: { id: actorId }, reason }).then((r) => viewOfConnect(r.run), (e: unknown) => Promise.reject(refusal(e))),
    close: () => {},
  };
}

interface GrpcRun {
  id: string;
  status: string;
  cancelled_by_actor_id: string;
  forked_from_run_id: string;
  forked_at_step: number;
  fork_reason: string;
  fork_run_ids: string[];
  connector: string;
  conversation_id: string;
}

async function grpcJsOperator(keel: TestKeel): Promise<OperatorClient> {
  const client = await grpcJsClient(keel.url, "run_service.proto", "RunService");
  const unary = (method: string, request: Record<string, unknown>) =>
    new Promise<RunView>((resolve, reject) => {
      const metadata = new grpc.Metadata();
      metadata.set("authorization", `Bearer ${keel.tokens.operator}`);
      const stub = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata, cb: (e: grpc.ServiceError | null, v: unknown) => void) => void>)[method]!;
      stub.call(client, request, metadata, (error, value) => {
        // grpc-js leaves the grpc-message header percent-encoded.
        if (error !== null) return reject(new Refusal(error.code, decodeURIComponent(error.details)));
        const run = (value as { run: GrpcRun }).run;
        resolve({
          id: run.id,
          status: run.status,
          cancelledByActorId: run.cancelled_by_actor_id,
          forkedFromRunId: run.forked_from_run_id,
          forkedAtStep: run.forked_at_step,
          forkReason: run.fork_reason,
          forkRunIds: run.fork_run_ids,
          connector: run.connector,
          conversationId: run.conversation_id,
        });
      });
    });
  return {
    name: "grpc-js (from .proto)",
    cancelRun: ({ runId, actorId, reason }) => unary("CancelRun", { run_id: runId, actor: { id: actorId }, reason }),
    forkRun: ({ runId, stepIndex, actorId, reason }) => unary("ForkRun", { run_id: runId, step_index: stepIndex, actor: { id: actorId }, reason }),
    close: () => client.close(),
  };
}

let keel: TestKeel;
let db: pg.Client;
const clients: OperatorClient[] = [];
let submitted = 0;

beforeAll(async () => {
  const effectsDir = await mkdtemp(path.join(tmpdir(), "keel-operator-rpcs-"));
  keel = await startTestKeel({
    tools: createTestTools({ effectsDir }),
    agents: [
      // A model call slow enough that a cancel lands while the run is running.
      scriptedAgent("op-slow", [turn("", [call("test.echo.v1", { text: "never" })], { delayMs: 1500 }), turn("should not be said")], {
        tools: toolGrants(["test.echo.v1"]),
      }),
      scriptedAgent("op-steps", [turn("", [call("test.echo.v1", { text: "one" })]), turn("", [call("test.echo.v1", { text: "two" })]), turn("all done")], {
        tools: toolGrants(["test.echo.v1"]),
      }),
    ],
  });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
  clients.push(connectOperator(keel), await grpcJsOperator(keel));
});

afterAll(async () => {
  for (const client of clients) client.close();
  await db?.end();
  await keel?.stop();
});

const ingress = () => connectClient(IngressService, keel.url, keel.tokens.connector);
const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);

async function submit(agentId: string): Promise<{ runId: string; connector: string }> {
  submitted += 1;
  const connector = `ops-${submitted}`;
  const { runId } = await ingress().submitMessage({
    agentId,
    conversationId: `c-${connector}`,
    actor: { id: "alice" },
    messageId: `m-${connector}`,
    text: `request ${submitted}`,
    connector,
  });
  return { runId, connector };
}

async function waitFor(runId: string, done: (run: Run) => boolean, timeoutMs = 30_000): Promise<Run> {
  const deadline = Date.now() + timeoutMs;
  let last: Run | undefined;
  while (Date.now() < deadline) {
    last = (await runs().getRun({ runId })).run;
    if (last !== undefined && done(last)) return last;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`run ${runId} never got there; last ${last === undefined ? "?" : RunStatus[last.status]}`);
}

const ended = (run: Run) => [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status);

async function stepsOf(runId: string): Promise<RunStep[]> {
  return (await runs().listRunSteps({ runId, pageSize: 100 })).steps;
}

async function eventSummaries(runId: string): Promise<string[]> {
  const { rows } = await db.query<{ summary: string }>("SELECT summary FROM run_event_feed WHERE run_id = $1 ORDER BY seq", [runId]);
  return rows.map((row) => row.summary);
}

async function refusalOf(promise: Promise<unknown>): Promise<Refusal> {
  const outcome = await promise.then(
    () => undefined,
    (error: unknown) => error,
  );
  if (!(outcome instanceof Refusal)) throw new Error(`expected a refusal, got ${String(outcome)}`);
  return outcome;
}

describe.each([0, 1])("operator RPCs through client %i", (which) => {
  const client = () => clients[which]!;

  it("CancelRun stops a running run at its next safe point, recorded with the operator and reason", async () => {
    const { runId } = await submit("op-slow");
    await waitFor(runId, (run) => run.status === RunStatus.RUNNING);
    const answered = await client().cancelRun({ runId, actorId: "op-olga", reason: "stuck on a dead host" });
    expect(answered.id).toBe(runId);
    // Until its next safe point the run may still be running; the request is recorded either way.
    expect(["RUN_STATUS_RUNNING", "RUN_STATUS_CANCELLED"]).toContain(answered.status);
    const run = await waitFor(runId, ended);
    expect(run.status).toBe(RunStatus.CANCELLED);
    expect(run.cancelledByActorId).toBe("op-olga");
    expect(await eventSummaries(runId)).toContain("cancellation requested by op-olga: stuck on a dead host");
    // The scripted turn after the cancel never ran.
    expect(run.finalReply).not.toBe("should not be said");

    // A run that ended refuses, saying how; an empty reason is refused before anything is read.
    const again = await refusalOf(client().cancelRun({ runId, actorId: "op-olga", reason: "twice" }));
    expect(again.code).toBe(Code.FailedPrecondition);
    expect(again.message).toContain("already ended as cancelled");
    const blank = await refusalOf(client().cancelRun({ runId, actorId: "op-olga", reason: "" }));
    expect(blank.code).toBe(Code.InvalidArgument);
    expect(blank.message).toMatch(/^reason: /);
  });

  it("ForkRun starts a run from a chosen step with a fresh budget, linked both ways, its reply kept off the conversation", async () => {
    const { runId: sourceId, connector } = await submit("op-steps");
    const source = await waitFor(sourceId, ended);
    expect(source.status).toBe(RunStatus.SUCCEEDED);
    expect(source.stepCount).toBe(3);

    const fork = await client().forkRun({ runId: sourceId, stepIndex: 0, actorId: "op-fred", reason: "try again from the first echo" });
    expect(fork.id).not.toBe(sourceId);
    expect(fork).toMatchObject({ forkedFromRunId: sourceId, forkedAtStep: 0, forkReason: "try again from the first echo", connector: FORK_CONNECTOR });
    expect(fork.conversationId).toBe(`fork-${fork.id}`);

    const done = await waitFor(fork.id, ended);
    expect(done.status).toBe(RunStatus.SUCCEEDED);
    expect(done.requestedBy?.id).toBe("op-fred");
    // Fresh budget: only the fork's own calls are counted (the scripted model starts its script again).
    expect(done.usage?.modelCalls).toBe(3);
    expect((await runs().getRun({ runId: sourceId })).run?.forkRunIds).toEqual([fork.id]);

    // The fork's first request carries the source's request and step 0's result, and nothing after it.
    const [first] = await stepsOf(fork.id);
    const request = first?.modelCall?.requestJson ?? "";
    expect(request).toContain(`request ${submitted}`);
    expect(request).toContain("echo: one");
    expect(request).not.toContain("echo: two");

    // Recorded, not sent: every emission of the fork is keyed to the fork connector, none to the source's.
    const { rows } = await db.query<{ connector: string }>("SELECT DISTINCT connector FROM emissions WHERE run_id = $1", [fork.id]);
    expect(rows.map((row) => row.connector)).toEqual([FORK_CONNECTOR]);
    expect(rows.map((row) => row.connector)).not.toContain(connector);
    expect(await eventSummaries(sourceId)).toContain(`forked at step 0 into run ${fork.id} by op-fred: try again from the first echo`);

    const beyond = await refusalOf(client().forkRun({ runId: sourceId, stepIndex: 7, actorId: "op-fred", reason: "no such step" }));
    expect(beyond.code).toBe(Code.FailedPrecondition);
    expect(beyond.message).toContain("has no committed step 7");
    const blank = await refusalOf(client().forkRun({ runId: sourceId, stepIndex: 0, actorId: "op-fred", reason: "" }));
    expect(blank.code).toBe(Code.InvalidArgument);
    expect(blank.message).toMatch(/^reason: /);
  });
});
