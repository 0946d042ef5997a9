// The Slack connector (Slack's own SocketModeClient and WebClient) between a real Keel and a local
// Slack that speaks the Web API and the Socket Mode protocol: what a Slack user would see (reactions,
// thread posts) and what Keel recorded (runs, edits, answers, delivery statuses).
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { startSlackConnector, type ConnectorEvent, type RunningConnector } from "../connectors/slack/connector.js";
import { callSlack, slackWebClient } from "../connectors/slack/slack-call.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedModel, scriptedTurn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { DeliveryStatus, EmissionKind, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { keelClients } from "../connectors/shared/keel-client.js";
import { ROOT, waitFor } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { BOT_USER_ID, startFakeSlack, type FakeSlack } from "./support/fake-slack.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const ALICE = "UALICE";
const BOB = "UBOB";
const LIFECYCLE = ["hourglass_flowing_sand", "eyes", "brain", "white_check_mark"];

/** Read tools that hold a run until the test opens them (test.<name>_gate.v1). */
function createGate(name: string) {
  let open: () => void = () => undefined;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const tool = defineTool<Record<string, never>>({
    name: `test.${name}_gate`,
    version: 1,
    description: "Waits until the test opens it (a read).",
    parameters: z.object({}),
    effect: "read",
    execute: (_args, context) =>
      new Promise((resolve, reject) => {
        void opened.then(() => resolve({ ok: true, text: "opened" }));
        context.signal.addEventListener("abort", () => reject(new Error("stopped")), { once: true });
      }),
  });
  return { tool, open: () => open(), fullName: `test.${name}_gate.v1` };
}
const longGate = createGate("long");
const editGate = createGate("edit");
const gatedAgent = (id: string, gate: { fullName: string }, reply: string) => ({
  ...scriptedAgent(id, [scriptedTurn("", [toolCall(gate.fullName, {})]), scriptedTurn(reply)]),
  tools: toolGrants([gate.fullName]),
});
// Triage says long, with the copy to post at once; the run then waits at its gate.
const longAgent = gatedAgent("long", longGate, "All done.");
const LONG_AGENT = {
  ...longAgent,
  models: { ...longAgent.models, fast: scriptedModel([scriptedTurn(JSON.stringify({ duration: "long", shape: "loop", ack_text: "On it: this one takes a while." }))]) },
};

let keel: TestKeel;
let dir: string;
beforeAll(async () => {
  keel = await startTestKeel({
    tools: [longGate.tool, editGate.tool],
    progress: { tickMs: 20 },
    agents: [
      LONG_AGENT,
      DEMO_AGENT,
      // Held at its gate, so an edit finds the run working.
      gatedAgent("slow", editGate, "Translated: {{message}}"),
      scriptedAgent("asker", [scriptedTurn("", [toolCall("keel.ask_user.v1", { question: "Which colour?" })]), scriptedTurn("Painted it.")]),
    ],
  });
  dir = await mkdtemp(path.join(tmpdir(), "keel-slack-"));
});
afterAll(async () => {
  await keel.stop();
  await rm(dir, { recursive: true, force: true });
});

interface Harness {
  readonly slack: FakeSlack;
  readonly events: ConnectorEvent[];
  connector: RunningConnector;
  readonly stateFile: string;
  restart(): Promise<void>;
  stop(): Promise<void>;
}

/** A fresh local Slack and a connector for `agentId` on it, under a connector name of its own. */
async function harness(agentId: string, connectorName: string, callTimeoutMs = 10_000): Promise<Harness> {
  const slack = await startFakeSlack();
  const events: ConnectorEvent[] = [];
  const stateFile = path.join(dir, `${connectorName}.json`);
  const start = () =>
    startSlackConnector({
      keelUrl: keel.url,
      keelToken: keel.tokens.connector,
      agentId,
      connector: connectorName,
      appToken: slack.appToken,
      botToken: slack.botToken,
      slackApiUrl: slack.apiUrl,
      stateFile,
      callTimeoutMs,
      backoffMs: 50,
      onEvent: (event) => events.push(event),
    });
  const h: Harness = {
    slack,
    events,
    connector: await start(),
    stateFile,
    async restart() {
      await h.connector.stop();
      h.connector = await start();
    },
    async stop() {
      await h.connector.stop();
      await slack.close();
    },
  };
  return h;
}

/** A person's message mentioning the bot, as Slack sends it: app_mention, then the channel's message event. */
async function mention(slack: FakeSlack, channel: string, user: string, text: string, threadTs?: string): Promise<string> {
  const ts = slack.nextTs();
  const message = { user, text: `<@${BOT_USER_ID}> ${text}`, ts, channel, client_msg_id: randomUUID(), ...(threadTs === undefined ? {} : { thread_ts: threadTs }) };
  await slack.deliver({ type: "app_mention", ...message });
  await slack.deliver({ type: "message", channel_type: "channel", ...message });
  return ts;
}

async function threadReply(slack: FakeSlack, channel: string, user: string, text: string, threadTs: string): Promise<string> {
  const ts = slack.nextTs();
  await slack.deliver({ type: "message", channel_type: "channel", user, text, ts, thread_ts: threadTs, channel, client_msg_id: randomUUID() });
  return ts;
}

const settledOn = (slack: FakeSlack, channel: string, ts: string) =>
  waitFor(`✅ on ${ts}`, async () => (slack.reactionsOn(channel, ts).join() === "white_check_mark" ? true : undefined), 30_000);

/** The reactions added to one message, in order. */
const added = (slack: FakeSlack, ts: string) => slack.reactionChanges.filter((change) => change.ts === ts && change.action === "add").map((change) => change.name);

/** The first `count` emissions of `connector`, as Keel holds them now. */
async function emissionsOf(connector: string, count: number): Promise<Emission[]> {
  const clients = keelClients(keel.url, keel.tokens.connector);
  const seen: Emission[] = [];
  const abort = new AbortController();
  try {
    for await (const { emission } of clients.emissions.subscribe({ connector }, { timeoutMs: 15_000, signal: abort.signal })) {
      if (emission !== undefined) seen.push(emission);
      if (seen.length === count) abort.abort();
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  }
  return seen;
}

/** The first `count` emissions of `connector` once the connector has acknowledged every one (it reacts, then acknowledges). */
const acknowledged = (connector: string, count: number) =>
  waitFor(
    `${count} acknowledged emissions of ${connector}`,
    async () => {
      const emissions = await emissionsOf(connector, count);
      return emissions.length === count && emissions.every((emission) => emission.deliveryStatus !== DeliveryStatus.PENDING) ? emissions : undefined;
    },
    30_000,
  );

const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);
const submittedRun = (events: ConnectorEvent[], messageId: string, type: "submitted" | "edited" | "answered" = "submitted") =>
  waitFor(`${type} ${messageId}`, async () => (events.find((event) => event.direction === "in" && event.type === type && event.messageId === messageId) as { runId?: string } | undefined)?.runId, 20_000);

describe("slack connector over Socket Mode", () => {
  it("a mention shows ⏳ → 👀 → 🧠 → ✅ and the reply in its thread; a thread reply is a new message; its own posts are ignored", async () => {
    const h = await harness("demo", "slack-main");
    try {
      const ts = await mention(h.slack, "C1", ALICE, "hi there");
      await settledOn(h.slack, "C1", ts);
      expect(added(h.slack, ts)).toEqual(LIFECYCLE);
      // Each new reaction replaces the one before: add the new, then remove the previous.
      const changes = h.slack.reactionChanges.filter((change) => change.ts === ts).map((change) => `${change.action} ${change.name}`);
      expect(changes).toEqual([
        "add hourglass_flowing_sand",
        "add eyes",
        "remove hourglass_flowing_sand",
        "add brain",
        "remove eyes",
        "add white_check_mark",
        "remove brain",
      ]);
      expect(h.slack.posts).toEqual([{ channel: "C1", ts: expect.any(String) as string, threadTs: ts, text: "Hello from Keel. You said: hi there" }]);
      const order = h.slack.calls.map((call) => `${call.method} ${call.args["name"] ?? call.args["thread_ts"] ?? ""}`);
      expect(order.indexOf(`chat.postMessage ${ts}`)).toBeGreaterThan(order.indexOf("reactions.add brain"));
      expect(order.indexOf(`chat.postMessage ${ts}`)).toBeLessThan(order.indexOf("reactions.add white_check_mark"));
      const runId = await submittedRun(h.events, ts);
      expect((await runs().getRun({ runId })).run).toMatchObject({ status: RunStatus.SUCCEEDED, agentId: "demo" });

      // A reply in the thread, no mention: a message of the same conversation, answered in the thread.
      const reply = await threadReply(h.slack, "C1", BOB, "and me?", ts);
      await settledOn(h.slack, "C1", reply);
      expect(h.slack.posts.map((post) => [post.threadTs, post.text])).toEqual([
        [ts, "Hello from Keel. You said: hi there"],
        [ts, "Hello from Keel. You said: and me?"],
      ]);
      const second = await submittedRun(h.events, reply);
      expect(second).not.toBe(runId);
      // A message outside any thread of ours is not the bot's business.
      const stray = h.slack.nextTs();
      await h.slack.deliver({ type: "message", user: BOB, text: "lunch?", ts: stray, channel: "C1" });
      await h.slack.deliver({ type: "message", user: BOB, text: "elsewhere", ts: h.slack.nextTs(), thread_ts: stray, channel: "C1" });
      const submitted = h.events.filter((event) => event.direction === "in" && event.type === "submitted");
      expect(submitted.map((event) => (event as { messageId?: string }).messageId)).toEqual([ts, reply]);
      // Every emission reached Slack and was acknowledged DELIVERED: two runs of five each.
      const emissions = await acknowledged("slack-main", 10);
      expect(emissions.map((emission) => DeliveryStatus[emission.deliveryStatus])).toEqual(Array.from({ length: 10 }, () => "DELIVERED"));
    } finally {
      await h.stop();
    }
  });

  it("an edit of the mention becomes EditMessage: the working run is superseded and the edit answered in the thread", async () => {
    const h = await harness("slow", "slack-edit");
    try {
      const ts = await mention(h.slack, "C2", ALICE, "translate to german");
      const first = await submittedRun(h.events, ts);
      await waitFor("the run at its gate", async () => ((await runs().listRunSteps({ runId: first })).steps.length > 0 ? true : undefined), 30_000);
      await h.slack.deliver({
        type: "message",
        subtype: "message_changed",
        hidden: true,
        channel: "C2",
        ts: h.slack.nextTs(),
        message: { type: "message", user: ALICE, text: `<@${BOT_USER_ID}> translate to dutch`, ts, edited: { user: ALICE, ts: h.slack.nextTs() } },
        previous_message: { type: "message", user: ALICE, text: `<@${BOT_USER_ID}> translate to german`, ts },
      });
      const editRun = await submittedRun(h.events, ts, "edited");
      expect(editRun).not.toBe(first);
      expect((await runs().getRun({ runId: first })).run?.supersededByRunId).toBe(editRun);
      editGate.open();
      await waitFor("the reply to the edit", async () => h.slack.posts.find((post) => post.text.includes("dutch")), 30_000);
      await settledOn(h.slack, "C2", ts);
      expect(h.slack.posts.map((post) => [post.threadTs, post.text])).toEqual([[ts, "Translated: (edited message) translate to dutch"]]);
      // Slack's bookkeeping changes (same text) are not edits.
      const edits = () => h.events.filter((event) => event.direction === "in" && event.type === "edited").length;
      const before = edits();
      await h.slack.deliver({
        type: "message",
        subtype: "message_changed",
        channel: "C2",
        ts: h.slack.nextTs(),
        message: { type: "message", user: ALICE, text: `<@${BOT_USER_ID}> translate to dutch`, ts },
        previous_message: { type: "message", user: ALICE, text: `<@${BOT_USER_ID}> translate to dutch`, ts },
      });
      expect(edits()).toBe(before);
    } finally {
      editGate.open();
      await h.stop();
    }
  });

  it("a question is posted to the asker in the thread; only their thread reply answers it", async () => {
    const h = await harness("asker", "slack-asker");
    try {
      const ts = await mention(h.slack, "C3", ALICE, "paint the shed");
      await waitFor("the question", async () => h.slack.posts.find((post) => post.text.includes("Which colour?")), 30_000);
      expect(h.slack.posts[0]).toMatchObject({ threadTs: ts, text: `<@${ALICE}> Which colour?` });
      const runId = await submittedRun(h.events, ts);
      // Someone else's reply is a message of its own, not the answer.
      const bobs = await threadReply(h.slack, "C3", BOB, "red!", ts);
      await submittedRun(h.events, bobs);
      const answer = await threadReply(h.slack, "C3", ALICE, "blue", ts);
      expect(await submittedRun(h.events, answer, "answered")).toBe(runId);
      await waitFor("the reply", async () => h.slack.posts.find((post) => post.text === "Painted it."), 30_000);
      // Bob's message is a run of its own, queued behind the one that asked (one root run per thread at a time).
      expect(h.slack.posts.slice(0, 2).map((post) => post.text)).toEqual([`<@${ALICE}> Which colour?`, "Painted it."]);
      const { steps } = await runs().listRunSteps({ runId });
      expect(steps[0]?.toolInvocations[0]).toMatchObject({ toolName: "keel.ask_user.v1", resultText: `Answer from ${ALICE}: blue` });
    } finally {
      await h.stop();
    }
  });

  it("a long run shows its progress notice in the thread before the reply, between ⏳ and ✅", async () => {
    const h = await harness("long", "slack-long");
    try {
      const ts = await mention(h.slack, "C5", ALICE, "rebuild the index");
      const notice = await waitFor("the progress notice", async () => h.slack.posts.find((post) => post.text.includes("On it: this one takes a while.")), 30_000);
      expect(notice).toMatchObject({ channel: "C5", threadTs: ts, text: "_On it: this one takes a while._" });
      expect(h.slack.reactionsOn("C5", ts)).not.toContain("white_check_mark");
      longGate.open();
      await settledOn(h.slack, "C5", ts);
      expect(added(h.slack, ts)).toEqual(LIFECYCLE);
      expect(h.slack.posts.map((post) => [post.threadTs, post.text])).toEqual([
        [ts, "_On it: this one takes a while._"],
        [ts, "All done."],
      ]);
      const order = h.slack.calls.map((call) => `${call.method} ${call.args["name"] ?? call.args["text"] ?? ""}`);
      expect(order.indexOf("chat.postMessage All done.")).toBeLessThan(order.indexOf("reactions.add white_check_mark"));
    } finally {
      longGate.open();
      await h.stop();
    }
  });

  it("a post that timed out after sending is AMBIGUOUS and never re-sent, across a restart and a rewound cursor", async () => {
    const h = await harness("demo", "slack-ambiguous", 1_000);
    try {
      h.slack.stallNext("chat.postMessage");
      const ts = await mention(h.slack, "C4", ALICE, "hello?");
      await settledOn(h.slack, "C4", ts);
      const postCalls = () => h.slack.calls.filter((call) => call.method === "chat.postMessage").length;
      expect(postCalls()).toBe(1);
      expect(h.slack.posts).toHaveLength(0);
      const emissions = await acknowledged("slack-ambiguous", 5);
      const reply = emissions.find((emission) => emission.kind === EmissionKind.REPLY);
      expect(reply?.deliveryStatus).toBe(DeliveryStatus.AMBIGUOUS);
      expect(emissions.filter((emission) => emission.kind === EmissionKind.ACK).map((emission) => emission.deliveryStatus)).toEqual(
        Array.from({ length: 4 }, () => DeliveryStatus.DELIVERED),
      );

      // Rewind the durable cursor to the start and reconnect: nothing is sent again.
      await h.connector.stop();
      const state = JSON.parse(await readFile(h.stateFile, "utf8")) as { afterSeq: number };
      expect(state.afterSeq).toBe(Number(emissions.at(-1)?.seq));
      await writeFile(h.stateFile, JSON.stringify({ ...state, afterSeq: 0 }));
      const callsBefore = h.slack.calls.length;
      await h.restart();
      await waitFor("the rewound stream to be skipped", async () => (h.events.filter((event) => event.direction === "out" && event.type === "skipped").length >= 5 ? true : undefined), 20_000);
      expect(h.slack.calls.slice(callsBefore).filter((call) => call.method !== "auth.test" && call.method !== "apps.connections.open")).toEqual([]);

      // Slack asks the socket to reconnect; the next mention still arrives and is answered once.
      const connections = h.slack.connections();
      h.slack.askToReconnect();
      await waitFor("a new Socket Mode connection", async () => (h.slack.connections() > connections ? true : undefined), 30_000);
      const next = await mention(h.slack, "C4", ALICE, "again", ts);
      await settledOn(h.slack, "C4", next);
      expect(postCalls()).toBe(2);
      expect(h.slack.posts).toEqual([{ channel: "C4", ts: expect.any(String) as string, threadTs: ts, text: "Hello from Keel. You said: again" }]);
    } finally {
      await h.stop();
    }
  });

  it("the program: killed between posting and acknowledging, it restarts and reports the post AMBIGUOUS, never re-sent", async () => {
    const slack = await startFakeSlack();
    const stateFile = path.join(dir, "slack-process.json");
    const program = () => {
      const child = spawn(process.execPath, ["--import", "tsx", path.join(ROOT, "connectors", "slack", "main.ts")], {
        cwd: ROOT,
        env: {
          ...process.env,
          KEEL_URL: keel.url,
          KEEL_TOKEN: keel.tokens.connector,
          KEEL_AGENT: "demo",
          SLACK_CONNECTOR: "slack-process",
          SLACK_APP_TOKEN: slack.appToken,
          SLACK_BOT_TOKEN: slack.botToken,
          SLACK_API_URL: slack.apiUrl,
          SLACK_STATE_FILE: stateFile,
          SLACK_CALL_TIMEOUT_MS: "60000",
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let output = "";
      child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString("utf8")));
      child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString("utf8")));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      const ready = waitFor("the connector program to connect", async () => (output.includes('"slack connected"') ? true : undefined), 60_000);
      return { child, exited, ready, output: () => output };
    };
    let running: ReturnType<typeof program> | undefined;
    const kill = async (child: ChildProcess) => {
      child.kill("SIGKILL");
      await running?.exited;
    };
    try {
      running = program();
      await running.ready;
      slack.stallNext("chat.postMessage");
      const ts = await mention(slack, "C6", ALICE, "careful now");
      await waitFor("the post to reach Slack", async () => (slack.calls.some((call) => call.method === "chat.postMessage") ? true : undefined), 30_000);
      await kill(running.child);
      expect(slack.reactionsOn("C6", ts)).not.toContain("white_check_mark");

      running = program();
      await running.ready;
      await settledOn(slack, "C6", ts);
      expect(slack.calls.filter((call) => call.method === "chat.postMessage")).toHaveLength(1);
      const emissions = await acknowledged("slack-process", 5);
      const reply = emissions.find((emission) => emission.kind === EmissionKind.REPLY);
      expect(reply?.deliveryStatus).toBe(DeliveryStatus.AMBIGUOUS);
      expect(emissions.filter((emission) => emission.kind === EmissionKind.ACK).every((emission) => emission.deliveryStatus === DeliveryStatus.DELIVERED)).toBe(true);
      running.child.kill("SIGTERM");
      expect(await running.exited).toBe(0);
    } finally {
      if (running !== undefined && running.child.exitCode === null) await kill(running.child);
      await slack.close();
    }
  });
});

describe("what a Web API failure means for delivery (Slack's WebClient against the local Slack)", () => {
  it("only a call that provably never reached Slack may be made again", async () => {
    const slack = await startFakeSlack();
    try {
      const web = slackWebClient({ token: slack.botToken, slackApiUrl: slack.apiUrl, timeoutMs: 1_000 });
      const post = { channel: "C9", text: "hi" };
      expect(await callSlack(web, "chat.postMessage", post)).toMatchObject({ kind: "ok" });
      expect(await callSlack(web, "chat.postMessage", { text: "hi" })).toEqual({ kind: "refused", error: "channel_not_found" });
      expect(await callSlack(web, "reactions.add", { channel: "C9", timestamp: "1.1", name: "eyes" })).toMatchObject({ kind: "ok" });
      expect(await callSlack(web, "reactions.add", { channel: "C9", timestamp: "1.1", name: "eyes" })).toEqual({ kind: "refused", error: "already_reacted" });
      slack.failNext("chat.postMessage", 429);
      expect(await callSlack(web, "chat.postMessage", post)).toEqual({ kind: "not-sent", reason: "rate limited", retryAfterMs: 1_000 });
      slack.failNext("chat.postMessage", 500);
      expect(await callSlack(web, "chat.postMessage", post)).toMatchObject({ kind: "ambiguous", reason: "Slack answered HTTP 500" });
      slack.stallNext("chat.postMessage");
      expect(await callSlack(web, "chat.postMessage", post)).toMatchObject({ kind: "ambiguous" });
      // Nothing listens on a closed port: the request never left.
      const closed = await startFakeSlack();
      await closed.close();
      const nowhere = slackWebClient({ token: slack.botToken, slackApiUrl: closed.apiUrl, timeoutMs: 1_000 });
      expect(await callSlack(nowhere, "chat.postMessage", post)).toEqual({ kind: "not-sent", reason: "ECONNREFUSED", retryAfterMs: 0 });
      // Each call above reached the local Slack exactly once: the client itself never retried.
      expect(slack.calls.filter((call) => call.method === "chat.postMessage")).toHaveLength(5);
    } finally {
      await slack.close();
    }
  });
});
