// Conversations through the public API, with a clock the test moves and scripted models:
// coalescing, follow-ups (refines, independent, cancels), supersession and inherited work,
// the commit boundary, the starvation bound, whose interrupt counts, edits, continuation
// consent, and acks that are never doubled. Tools that must hold a run mid-flight wait on a
// gate the test opens, so "while the run is working" is a fact, not a race.
import { sql } from "../control-plane/src/ledger/sql.js";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckState, EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { CommitBoundary, RunStatus, WaitReason, type Run, type RunStep } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { withBudgetDefaults, type AgentSpec, type InterruptSettings, type RunBudget, type ScriptedTurn } from "../control-plane/src/domain/agent.js";
import type { ConsentAnswer, FollowUpRelation } from "../control-plane/src/domain/interrupt.js";
import { connectClient, grpcJsClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { createGate } from "./support/gate-tool.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { ManualClock } from "./support/manual-clock.js";
import { scriptedModel, scriptedTurn as turn, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// --- Agents

const gateTurn = (name: string) => turn("", [{ toolName: "test.gate.v1", argumentsJson: JSON.stringify({ name }) }]);
const askTurn = turn("", [{ toolName: "keel.ask_user.v1", argumentsJson: JSON.stringify({ question: "Which colour?" }) }]);
const writeTurn = (key: string) => turn("", [{ toolName: "test.append_line.v1", argumentsJson: JSON.stringify({ key }) }]);
const echoTurn = turn("", [{ toolName: "test.echo.v1", argumentsJson: JSON.stringify({ text: "step one" }) }]);
const replyTurn = turn("Done: {{message}}");

function agent(
  id: string,
  turns: ScriptedTurn[],
  options: { interrupt?: Partial<InterruptSettings>; budget?: Partial<RunBudget>; maxConcurrentRootRuns?: number } = {},
): AgentSpec {
  const answering = (text: string) => scriptedModel([turn(text)]);
  return {
    ...DEMO_AGENT,
    id,
    models: { primary: scriptedModel(turns), fast: answering("independent"), decision: answering("unclear") },
    tools: toolGrants(["test.gate.v1", "test.echo.v1", "test.append_line.v1"]),
    interrupt: { coalesceWindowMs: 0, scope: "thread_scoped", maxSupersessions: 3, supersessionCeilingMs: 120_000, ...options.interrupt },
    budget: withBudgetDefaults(options.budget ?? {}),
    ...(options.maxConcurrentRootRuns === undefined ? {} : { maxConcurrentRootRuns: options.maxConcurrentRootRuns }),
  };
}

const AGENTS: AgentSpec[] = [
  agent("coalescer", [replyTurn], { interrupt: { coalesceWindowMs: 2_000 } }),
  agent("shortener", [gateTurn("shortener"), replyTurn], { interrupt: { coalesceWindowMs: 2_000 } }),
  agent("committer", [writeTurn("deploy"), gateTurn("committer"), replyTurn]),
  agent("stopper", [writeTurn("half"), gateTurn("stopper"), replyTurn]),
  agent("chatty", [gateTurn("chatty"), replyTurn], { interrupt: { maxSupersessions: 2 } }),
  agent("ceiling", [gateTurn("ceiling"), replyTurn], { interrupt: { supersessionCeilingMs: 10_000 } }),
  agent("same-actor", [askTurn, gateTurn("same-actor"), replyTurn], { interrupt: { scope: "same_actor_only" } }),
  agent("thread", [askTurn, gateTurn("thread"), replyTurn], { interrupt: { scope: "thread_scoped" } }),
  agent("addressed", [askTurn, gateTurn("addressed"), replyTurn], { interrupt: { scope: "addressed_actor_only" } }),
  agent("editor", [gateTurn("editor"), replyTurn], { interrupt: { coalesceWindowMs: 2_000 } }),
  // An iteration budget, not a model-call one: the fast model's triage call counts against model
  // calls, and whether it lands before the first turn is a race.
  agent("tired", [echoTurn, replyTurn], { budget: { maxIterations: 1 } }),
  agent("slow-reply", [echoTurn, { ...replyTurn, delayMs: 1_500 }]),
];

// --- The Keel under test and its clients

const clock = new ManualClock();
const gate = createGate();
let keel: TestKeel;
let effectsDir: string;
let grpcIngress: GrpcJsIngress;

beforeAll(async () => {
  effectsDir = await mkdtemp(path.join(tmpdir(), "keel-conversations-"));
  keel = await startTestKeel({ agents: AGENTS, tools: [gate.tool, ...createTestTools({ effectsDir })], workers: 4, clock });
  grpcIngress = await loadGrpcJsIngress(keel.url, keel.tokens.connector);
});

afterAll(async () => {
  grpcIngress?.close();
  await keel?.stop();
});

const ingress = () => connectClient(IngressService, keel.url, keel.tokens.connector);
const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);

let messages = 0;
async function say(agentId: string, conversation: string, actor: string, text: string, messageId = `m${++messages}`) {
  const response = await ingress().submitMessage({ agentId, conversationId: conversation, actor: { id: actor }, messageId, text, connector: conversation });
  return { ...response, messageId };
}

async function getRun(runId: string): Promise<Run> {
  const { run } = await runs().getRun({ runId });
  if (run === undefined) throw new Error(`run ${runId} not found`);
  return run;
}

async function waitFor(runId: string, statuses: readonly RunStatus[], timeoutMs = 15_000): Promise<Run> {
  const deadline = Date.now() + timeoutMs;
  let last: Run | undefined;
  while (Date.now() < deadline) {
    last = await getRun(runId);
    if (statuses.includes(last.status)) return last;
    await sleep(25);
  }
  throw new Error(`run ${runId} did not reach ${statuses.map((s) => RunStatus[s]).join("|")}; last ${last === undefined ? "?" : RunStatus[last.status]}`);
}

const TERMINAL = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED];

/** Moves the clock and wakes every worker, as the end of a window would. */
async function advance(ms: number): Promise<void> {
  clock.advance(ms);
  await keel.app.ledger.sql.query(sql`SELECT pg_notify('keel_runs', '')`);
}

/** What the fast model will answer the next follow-up question with. */
async function fastModelSays(agentId: string, relation: FollowUpRelation): Promise<void> {
  const spec = (await keel.app.agents.get(agentId))!;
  await keel.app.agents.put({ ...spec, models: { ...spec.models, fast: { ...spec.models.fast, scriptedTurns: [turn(relation)] } } });
}

/** What the decision model will answer the next consent question with. */
async function decisionModelSays(agentId: string, answer: ConsentAnswer | "gibberish"): Promise<void> {
  const spec = (await keel.app.agents.get(agentId))!;
  await keel.app.agents.put({ ...spec, models: { ...spec.models, decision: { ...spec.models.decision, scriptedTurns: [turn(answer)] } } });
}

async function stepsOf(runId: string): Promise<RunStep[]> {
  return (await runs().listRunSteps({ runId })).steps;
}

/** The messages a step's model call was shown. */
function shown(step: RunStep | undefined): { role: string; content: string }[] {
  return (JSON.parse(step?.modelCall?.requestJson ?? "{}") as { messages?: { role: string; content: string }[] }).messages ?? [];
}

async function conversationRuns(conversation: string): Promise<Run[]> {
  return (await runs().listRuns({ conversationId: conversation })).runs;
}

/** Every emission on a connector so far (each conversation here has its own connector). */
async function emissionsOn(connector: string): Promise<Emission[]> {
  const abort = new AbortController();
  const seen: Emission[] = [];
  let quiet = setTimeout(() => abort.abort(), 500);
  try {
    for await (const { emission } of connectClient(EmissionService, keel.url, keel.tokens.connector).subscribe({ connector }, { signal: abort.signal })) {
      if (emission !== undefined) seen.push(emission);
      clearTimeout(quiet);
      quiet = setTimeout(() => abort.abort(), 300);
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  } finally {
    clearTimeout(quiet);
  }
  return seen;
}

// The reaction's two ends; the started/thinking states between them are test/ack-lifecycle.test.ts's.
const acks = (emissions: readonly Emission[]) =>
  emissions.filter((e) => e.kind === EmissionKind.ACK && e.ackState !== AckState.STARTED && e.ackState !== AckState.THINKING);

// --- grpc-js, from the .proto files only, as a connector in another language would call.

interface GrpcJsIngress {
  call<T>(method: "SubmitMessage" | "EditMessage" | "ContinueRun", request: Record<string, unknown>): Promise<T>;
  close(): void;
}

async function loadGrpcJsIngress(url: string, token: string): Promise<GrpcJsIngress> {
  const client = await grpcJsClient(url, "ingress_service.proto", "IngressService");
  return {
    call: (method, request) =>
      new Promise((resolve, reject) => {
        const metadata = new grpc.Metadata();
        metadata.set("authorization", `Bearer ${token}`);
        const stub = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata, cb: (e: grpc.ServiceError | null, v: unknown) => void) => void>)[method]!;
        stub.call(client, request, metadata, (error, value) => (error === null ? resolve(value as never) : reject(error)));
      }),
    close: () => client.close(),
  };
}

// ---------------------------------------------------------------------------------------

describe("coalescing", () => {
  it("makes four rapid messages one run with four triggers, acked once", async () => {
    const conversation = "rapid";
    const first = await say("coalescer", conversation, "alice", "build me a url shortener");
    expect((await getRun(first.runId)).waitReason).toBe(WaitReason.COALESCING);
    for (const text of ["it should have an api", "and a web page", "deploy it somewhere cheap"]) {
      await advance(500);
      const next = await say("coalescer", conversation, "alice", text);
      expect(next.runId).toBe(first.runId);
    }
    // 1.5 s after the last message the window (2 s) is still open; then it ends.
    await advance(1_500);
    expect((await getRun(first.runId)).status).toBe(RunStatus.QUEUED);
    await advance(600);
    const run = await waitFor(first.runId, TERMINAL);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.triggers.map((t) => t.actorId)).toEqual(["alice", "alice", "alice", "alice"]);
    expect(run.triggers).toHaveLength(4);
    const userMessages = shown((await stepsOf(first.runId))[0]).filter((m) => m.role === "user").map((m) => m.content);
    expect(userMessages).toEqual(["build me a url shortener", "it should have an api", "and a web page", "deploy it somewhere cheap"]);
    expect(await conversationRuns(conversation)).toHaveLength(1);
    const emitted = acks(await emissionsOn(conversation));
    expect(emitted.map((e) => e.ackState)).toEqual([AckState.WORKING, AckState.SUCCEEDED]);
    expect(emitted[0]?.replyToMessageId).toBe(first.messageId);
  });

  it("records every actor of a merged run as a trigger and addresses its reply to each", async () => {
    const conversation = "two-voices";
    const alice = await say("coalescer", conversation, "alice", "what should we name the project?");
    await advance(300);
    const bob = await say("coalescer", conversation, "bob", "something short please");
    expect(bob.runId).toBe(alice.runId);
    await advance(2_100);
    const run = await waitFor(alice.runId, TERMINAL);
    expect(run.triggers.map((t) => t.actorId)).toEqual(["alice", "bob"]);
    const userMessages = shown((await stepsOf(run.id))[0]).filter((m) => m.role === "user").map((m) => m.content);
    expect(userMessages).toEqual(["alice: what should we name the project?", "bob: something short please"]);
    const reply = (await emissionsOn(conversation)).find((e) => e.kind === EmissionKind.REPLY);
    expect(reply?.addressedActorIds).toEqual(["alice", "bob"]);
  });
});

describe("follow-ups: refine, independent, cancel", () => {
  it("supersedes on a refinement, inherits the work, queues an independent request behind it, and stops on 'never mind'", async () => {
    const conversation = "shortener";
    const first = await say("shortener", conversation, "alice", "build me a url shortener");
    await advance(2_100);
    await gate.reached("shortener");
    const original = await waitFor(first.runId, [RunStatus.AWAITING_TOOL, RunStatus.RUNNING]);
    expect(original.commitBoundary).toBe(CommitBoundary.BUFFERING);

    // "actually, in rust" refines the run in flight: a successor takes over the same request.
    await fastModelSays("shortener", "refines");
    const refined = await say("shortener", conversation, "alice", "actually, in rust");
    expect(refined.runId).not.toBe(first.runId);
    expect((await getRun(first.runId)).supersededByRunId).toBe(refined.runId);
    await advance(2_100);
    const waiting = await getRun(refined.runId);
    expect(waiting.status).toBe(RunStatus.QUEUED);
    expect(waiting.waitReason).toBe(WaitReason.CONVERSATION_BUSY); // the superseded run has not reached its safe point yet

    gate.open("shortener"); // the first run finishes its read, reaches a safe point and stops
    const superseded = await waitFor(first.runId, TERMINAL);
    expect(superseded.status).toBe(RunStatus.CANCELLED);
    expect(superseded.supersededByRunId).toBe(refined.runId);
    expect(superseded.finalReply).toBe("");
    await advance(0);
    await gate.reached("shortener");

    // The successor starts from the completed read instead of from nothing.
    const successorRequest = shown((await stepsOf(refined.runId))[0]);
    expect(successorRequest[0]?.role).toBe("system");
    expect(successorRequest.slice(1).map((m) => [m.role, m.content])).toEqual([
      ["user", "build me a url shortener"],
      ["assistant", ""],
      ["tool", "gate shortener opened"],
      ["user", "actually, in rust"],
    ]);
    const successor = await getRun(refined.runId);
    expect(successor.triggers.map((t) => t.messageId)).toEqual([first.messageId, refined.messageId]);

    // "also, what's the weather" is independent: a separate run, queued behind, never interrupting.
    await fastModelSays("shortener", "independent");
    const weather = await say("shortener", conversation, "alice", "also, what's the weather");
    expect(weather.runId).not.toBe(refined.runId);
    await advance(2_100);
    const queued = await getRun(weather.runId);
    expect(queued).toMatchObject({ status: RunStatus.QUEUED, waitReason: WaitReason.CONVERSATION_BUSY, queuePosition: 1 });
    expect((await getRun(refined.runId)).supersededByRunId).toBe("");

    // "never mind, stop" cancels the request in flight at its next safe point.
    await fastModelSays("shortener", "cancels");
    const stop = await say("shortener", conversation, "alice", "never mind, stop");
    expect(stop.runId).toBe(refined.runId);
    gate.open("shortener");
    const stopped = await waitFor(refined.runId, TERMINAL);
    expect(stopped.status).toBe(RunStatus.CANCELLED);
    expect(stopped.cancelledByActorId).toBe("alice");

    // The weather question then gets its turn and its own answer.
    await advance(0);
    await gate.reached("shortener");
    gate.open("shortener");
    expect((await waitFor(weather.runId, TERMINAL)).status).toBe(RunStatus.SUCCEEDED);

    // Acks: one hourglass and one mark per logical request, none for the superseded run.
    const emitted = await emissionsOn(conversation);
    const byKey = acks(emitted).map((e) => [e.idempotencyKey, e.ackState, e.replyToMessageId]);
    expect(byKey).toEqual([
      [`ack:${first.runId}:working`, AckState.WORKING, first.messageId],
      [`ack:${weather.runId}:working`, AckState.WORKING, weather.messageId],
      [`ack:${first.runId}:settled`, AckState.FAILED, first.messageId],
      [`ack:${weather.runId}:settled`, AckState.SUCCEEDED, weather.messageId],
    ]);
    expect(acks(emitted).filter((e) => e.runId === first.runId)).toHaveLength(1); // only the hourglass
  });

  it("never restarts a run past its commit boundary: a refinement is folded in at the next step", async () => {
    const conversation = "committed";
    const first = await say("committer", conversation, "alice", "deploy the site");
    await gate.reached("committer");
    expect((await getRun(first.runId)).commitBoundary).toBe(CommitBoundary.COMMITTED);
    await fastModelSays("committer", "refines");
    const refined = await say("committer", conversation, "alice", "actually, use the blue theme");
    expect(refined.runId).toBe(first.runId); // amended, not superseded
    gate.open("committer");
    const run = await waitFor(first.runId, TERMINAL);
    expect(run).toMatchObject({ status: RunStatus.SUCCEEDED, supersededByRunId: "" });
    const steps = await stepsOf(first.runId);
    expect(shown(steps[2]).at(-1)).toMatchObject({ role: "user", content: "actually, use the blue theme" });
    expect(run.finalReply).toBe("Done: actually, use the blue theme");
    expect(await conversationRuns(conversation)).toHaveLength(1);
    expect(writesRecorded(effectsDir).filter((line) => line.endsWith(" deploy"))).toHaveLength(1);
  });

  it("stops a committed run with a partial result the user is told about", async () => {
    const conversation = "stopped-late";
    const first = await say("stopper", conversation, "alice", "migrate the database");
    await gate.reached("stopper");
    await fastModelSays("stopper", "cancels");
    await say("stopper", conversation, "alice", "never mind, stop");
    gate.open("stopper");
    const run = await waitFor(first.runId, TERMINAL);
    expect(run.status).toBe(RunStatus.CANCELLED);
    const reply = (await emissionsOn(conversation)).find((e) => e.kind === EmissionKind.REPLY);
    expect(reply?.text).toContain("were not undone");
    expect(reply?.text).toContain("test.append_line.v1");
    expect(writesRecorded(effectsDir).filter((line) => line.endsWith(" half"))).toHaveLength(1);
  });
});

describe("a stop that lands while the model writes the final reply", () => {
  it("wins: the run ends superseded without replying, and only its successor answers", async () => {
    const conversation = "slow-reply";
    const first = await say("slow-reply", conversation, "alice", "draft the memo");
    // The read step is committed; the reply's model call (1.5 s) is in flight.
    for (let i = 0; i < 200 && (await stepsOf(first.runId)).length === 0; i++) await sleep(10);
    await sleep(100);
    await fastModelSays("slow-reply", "refines");
    const refined = await say("slow-reply", conversation, "alice", "make it short");
    expect(refined.runId).not.toBe(first.runId);

    const superseded = await waitFor(first.runId, TERMINAL);
    expect(superseded).toMatchObject({ status: RunStatus.CANCELLED, supersededByRunId: refined.runId, finalReply: "" });
    // The reply the model wrote after the stop was never committed: only the read step is there.
    expect((await stepsOf(first.runId)).map((s) => s.modelCall?.responseText)).toEqual([""]);
    const successor = await waitFor(refined.runId, TERMINAL);
    expect(successor.status).toBe(RunStatus.SUCCEEDED);
    const emitted = await emissionsOn(conversation);
    expect(emitted.filter((e) => e.kind === EmissionKind.REPLY).map((e) => e.text)).toEqual(["Done: make it short"]);
    expect(acks(emitted).map((e) => e.ackState)).toEqual([AckState.WORKING, AckState.SUCCEEDED]);
  });
});

describe("the starvation bound", () => {
  it("lets a chatty actor supersede only up to the bound; then the run finishes and the rest queues", async () => {
    const conversation = "chatty";
    await fastModelSays("chatty", "refines");
    const chain = [(await say("chatty", conversation, "alice", "write a haiku")).runId];
    for (const text of ["about autumn", "with a cat in it"]) {
      await gate.reached("chatty");
      const next = await say("chatty", conversation, "alice", text);
      expect(next.runId).not.toBe(chain.at(-1));
      gate.open("chatty");
      await waitFor(chain.at(-1)!, TERMINAL);
      chain.push(next.runId);
      await advance(0);
    }
    // Two supersessions taken: the third refinement may not interrupt again.
    await gate.reached("chatty");
    const late = await say("chatty", conversation, "alice", "no, a limerick");
    expect(chain).not.toContain(late.runId);
    gate.open("chatty");
    const finished = await waitFor(chain.at(-1)!, TERMINAL);
    expect(finished.status).toBe(RunStatus.SUCCEEDED);
    expect(finished.triggers).toHaveLength(3);
    for (const [i, runId] of chain.slice(0, -1).entries()) {
      expect(await getRun(runId)).toMatchObject({ status: RunStatus.CANCELLED, supersededByRunId: chain[i + 1] });
    }
    // The late message is answered on its own, after.
    await advance(0);
    await gate.reached("chatty");
    gate.open("chatty");
    const queued = await waitFor(late.runId, TERMINAL);
    expect(queued.status).toBe(RunStatus.SUCCEEDED);
    expect(queued.triggers.map((t) => t.messageId)).toEqual([late.messageId]);
  });

  it("stops accepting interrupts once the wall-clock ceiling has passed", async () => {
    const conversation = "ceiling";
    await fastModelSays("ceiling", "refines");
    const first = await say("ceiling", conversation, "alice", "summarize the thread");
    await gate.reached("ceiling");
    clock.advance(10_001);
    const late = await say("ceiling", conversation, "alice", "in french");
    expect(late.runId).not.toBe(first.runId);
    expect((await getRun(first.runId)).supersededByRunId).toBe("");
    gate.open("ceiling");
    expect((await waitFor(first.runId, TERMINAL)).status).toBe(RunStatus.SUCCEEDED);
    await advance(0);
    await gate.reached("ceiling");
    gate.open("ceiling");
    expect((await waitFor(late.runId, TERMINAL)).status).toBe(RunStatus.SUCCEEDED);
  });
});

describe("whose interrupt counts", () => {
  /** Alice asks; the run asks a question; Bob answers; the run is then working at its gate. */
  async function answeredByBob(agentId: string, conversation: string): Promise<string> {
    await fastModelSays(agentId, "refines");
    const { runId } = await say(agentId, conversation, "alice", "paint the fence");
    await waitFor(runId, [RunStatus.AWAITING_INPUT]);
    await ingress().answerInput({ runId, actor: { id: "bob" }, text: "blue" });
    await gate.reached(agentId);
    return runId;
  }

  it("same_actor_only: another actor's refinement is its own request; the requester's supersedes", async () => {
    const runId = await answeredByBob("same-actor", "scope-same");
    const bobs = await say("same-actor", "scope-same", "bob", "actually, green");
    expect(bobs.runId).not.toBe(runId);
    expect((await getRun(runId)).supersededByRunId).toBe("");
    const alices = await say("same-actor", "scope-same", "alice", "actually, red");
    expect((await getRun(runId)).supersededByRunId).toBe(alices.runId);
    expect((await getRun(alices.runId)).triggers.map((t) => t.actorId)).toEqual(["alice", "alice"]);
    gate.open("same-actor");
    await waitFor(runId, TERMINAL);
  });

  it("thread_scoped: anyone in the conversation may refine; the successor answers both", async () => {
    const runId = await answeredByBob("thread", "scope-thread");
    const carols = await say("thread", "scope-thread", "carol", "actually, green");
    expect((await getRun(runId)).supersededByRunId).toBe(carols.runId);
    expect((await getRun(carols.runId)).triggers.map((t) => t.actorId)).toEqual(["alice", "carol"]);
    gate.open("thread");
    await waitFor(runId, TERMINAL);
    // The successor inherits the answered question; it asks again (the script restarts) and parks.
    await advance(0);
    const successor = await waitFor(carols.runId, [RunStatus.AWAITING_INPUT]);
    const inherited = shown((await stepsOf(successor.id))[0]).map((m) => m.content);
    expect(inherited).toContain("Answer from bob: blue");
    expect(inherited.at(-1)).toBe("carol: actually, green");
  });

  it("addressed_actor_only: only actors the agent is answering count; who answered its question does", async () => {
    const runId = await answeredByBob("addressed", "scope-addressed");
    const carols = await say("addressed", "scope-addressed", "carol", "actually, green");
    expect(carols.runId).not.toBe(runId);
    expect((await getRun(runId)).supersededByRunId).toBe("");
    const bobs = await say("addressed", "scope-addressed", "bob", "actually, red");
    expect((await getRun(runId)).supersededByRunId).toBe(bobs.runId);
    gate.open("addressed");
    await waitFor(runId, TERMINAL);
  });
});

describe("message edits", () => {
  it("an edit inside the coalesce window simply joins the run", async () => {
    const conversation = "edit-early";
    const first = await say("editor", conversation, "alice", "translate this to german");
    const edited = await grpcIngress.call<{ run_id: string }>("EditMessage", {
      agent_id: "editor",
      conversation_id: conversation,
      message_id: first.messageId,
      actor: { id: "alice" },
      text: "translate this to dutch",
    });
    expect(edited.run_id).toBe(first.runId);
    expect((await getRun(first.runId)).triggers).toHaveLength(2);
    await advance(2_100);
    await gate.reached("editor");
    gate.open("editor");
    const run = await waitFor(first.runId, TERMINAL);
    expect(shown((await stepsOf(run.id))[0]).filter((m) => m.role === "user").map((m) => m.content)).toEqual([
      "translate this to german",
      "(edited message) translate this to dutch",
    ]);
  });

  it("an edit of a message whose run is working goes through the refinement policy: it supersedes", async () => {
    const conversation = "edit-late";
    const first = await say("editor", conversation, "alice", "translate this to german");
    await advance(2_100);
    await gate.reached("editor");
    const edited = await grpcIngress.call<{ run_id: string }>("EditMessage", {
      agent_id: "editor",
      conversation_id: conversation,
      message_id: first.messageId,
      actor: { id: "alice" },
      text: "translate this to dutch",
    });
    expect(edited.run_id).not.toBe(first.runId);
    expect((await getRun(first.runId)).supersededByRunId).toBe(edited.run_id);
    // Only the author may edit; the same edit twice changes nothing.
    await expect(ingress().editMessage({ agentId: "editor", conversationId: conversation, messageId: first.messageId, actor: { id: "mallory" }, text: "x" })).rejects.toMatchObject({
      code: Code.PermissionDenied,
    });
    const again = await ingress().editMessage({ agentId: "editor", conversationId: conversation, messageId: first.messageId, actor: { id: "alice" }, text: "translate this to dutch" });
    expect(again.runId).toBe(edited.run_id);
    gate.open("editor");
    await waitFor(first.runId, TERMINAL);
    await advance(2_100);
    await gate.reached("editor");
    gate.open("editor");
    expect((await waitFor(edited.run_id, TERMINAL)).status).toBe(RunStatus.SUCCEEDED);
  });
});

describe("continuation consent after budget_exhausted", () => {
  async function exhausted(conversation: string): Promise<Run> {
    const { runId } = await say("tired", conversation, "alice", "index the whole wiki");
    const run = await waitFor(runId, TERMINAL);
    expect(run.status).toBe(RunStatus.BUDGET_EXHAUSTED);
    expect(run.finalReply).toContain("Reply yes to continue");
    return run;
  }

  const continuations = async (conversation: string, of: string) => (await conversationRuns(conversation)).filter((r) => r.continuationOfRunId === of);

  it("yes from the requester authorizes exactly one fresh bounded run with the saved context", async () => {
    const run = await exhausted("consent-yes");
    await decisionModelSays("tired", "yes");
    const reply = await say("tired", "consent-yes", "alice", "yes please, keep going");
    expect(reply.runId).not.toBe(run.id);
    const continued = await waitFor(reply.runId, TERMINAL);
    expect(continued.continuationOfRunId).toBe(run.id);
    expect(continued.status).toBe(RunStatus.BUDGET_EXHAUSTED); // fresh, and bounded like the first
    const request = shown((await stepsOf(continued.id))[0]).map((m) => m.content);
    expect(request).toContain("index the whole wiki");
    expect(request).toContain("echo: step one"); // the work the exhausted run did
    expect(request.at(-1)).toMatch(/fresh budget was granted: yes please, keep going$/);
    // One yes, one run: ContinueRun on the same exhausted run is refused now.
    await expect(ingress().continueRun({ runId: run.id, actor: { id: "alice" }, text: "yes" })).rejects.toMatchObject({ code: Code.FailedPrecondition });
    expect(await continuations("consent-yes", run.id)).toHaveLength(1);
  });

  it("yes through ContinueRun (grpc-js) authorizes one run; a retry of the same reply returns it again", async () => {
    const run = await exhausted("consent-rpc");
    await decisionModelSays("tired", "yes");
    const request = { run_id: run.id, actor: { id: "alice" }, text: "yes", message_id: "consent-rpc-yes" };
    const first = await grpcIngress.call<{ run_id: string; authorized: boolean }>("ContinueRun", request);
    expect(first.authorized).toBe(true);
    const retried = await grpcIngress.call<{ run_id: string; authorized: boolean }>("ContinueRun", request);
    expect(retried).toEqual(first);
    expect((await getRun(first.run_id)).continuationOfRunId).toBe(run.id);
  });

  it("no authorizes nothing", async () => {
    const run = await exhausted("consent-no");
    await decisionModelSays("tired", "no");
    const reply = await say("tired", "consent-no", "alice", "no, leave it");
    expect(reply.runId).toBe(run.id);
    expect(reply.status).toBe(RunStatus.BUDGET_EXHAUSTED);
    const viaRpc = await ingress().continueRun({ runId: run.id, actor: { id: "alice" }, text: "no thanks" });
    expect(viaRpc).toMatchObject({ runId: run.id, authorized: false });
    expect(await conversationRuns("consent-no")).toHaveLength(1);
  });

  it("silence authorizes nothing", async () => {
    const run = await exhausted("consent-silence");
    await advance(24 * 3_600_000);
    await sleep(300);
    expect(await conversationRuns("consent-silence")).toHaveLength(1);
    expect((await getRun(run.id)).status).toBe(RunStatus.BUDGET_EXHAUSTED);
  });

  it("an ambiguous reply authorizes nothing: it is a new request without the saved context", async () => {
    const run = await exhausted("consent-unclear");
    await decisionModelSays("tired", "gibberish"); // off the list: the decision falls back to unclear
    const reply = await say("tired", "consent-unclear", "alice", "hmm, maybe later?");
    expect(reply.runId).not.toBe(run.id);
    expect((await getRun(reply.runId)).continuationOfRunId).toBe("");
    expect(await continuations("consent-unclear", run.id)).toHaveLength(0);
  });

  it("another actor's yes authorizes nothing", async () => {
    const run = await exhausted("consent-other");
    await decisionModelSays("tired", "yes");
    const bobs = await say("tired", "consent-other", "bob", "yes");
    expect((await getRun(bobs.runId)).continuationOfRunId).toBe("");
    const viaRpc = await ingress().continueRun({ runId: run.id, actor: { id: "bob" }, text: "yes" });
    expect(viaRpc).toMatchObject({ runId: run.id, authorized: false });
    expect(await continuations("consent-other", run.id)).toHaveLength(0);
  });
});

describe("idempotent submission", () => {
  it("a retried follow-up returns the run it landed in and changes nothing", async () => {
    const conversation = "retry";
    const first = await say("coalescer", conversation, "alice", "hello", "retry-1");
    const again = await say("coalescer", conversation, "alice", "hello", "retry-1");
    expect(again).toMatchObject({ runId: first.runId, duplicate: true });
    await advance(2_100);
    await waitFor(first.runId, TERMINAL);
    await expect(ingress().submitMessage({ agentId: "nobody", conversationId: "x", actor: { id: "a" }, messageId: "y", text: "z" })).rejects.toBeInstanceOf(ConnectError);
  });
});
