// The webhook connector against a real Keel and a local peer that answers, refuses, stalls,
// resets and fails: what reached the peer, and the delivery status Keel recorded for each emission.
import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliveryStatus, EmissionKind, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { keelClients, type KeelClients } from "../connectors/shared/keel-client.js";
import { createInboundHandler } from "../connectors/webhook/inbound.js";
import { runOutbound, type OutboundEvent, type OutboundOptions } from "../connectors/webhook/outbound.js";
import { sign, signatureProblem } from "../connectors/webhook/signature.js";
import { waitFor } from "./support/child-processes.js";
import { freePort } from "./support/global-setup.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const IN_SECRET = "in-secret";
const OUT_SECRET = "out-secret";

let keel: TestKeel;
let clients: KeelClients;
let dir: string;

beforeAll(async () => {
  keel = await startTestKeel();
  clients = keelClients(keel.url, keel.tokens.connector);
  dir = await mkdtemp(path.join(tmpdir(), "keel-webhook-"));
});
afterAll(async () => {
  await keel.stop();
  await rm(dir, { recursive: true, force: true });
});

type Behaviour = "ok" | "stall" | "reset" | number;
interface Received {
  readonly headers: IncomingMessage["headers"];
  readonly body: Record<string, unknown>;
  readonly signatureProblem: string | undefined;
}

/** A peer whose answer to each POST is `behaviour()`; it records every request it read in full. */
async function startPeer(behaviour: () => Behaviour, port = 0): Promise<{ server: Server; url: string; received: Received[] }> {
  const received: Received[] = [];
  const stalled: ServerResponse[] = [];
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const raw = Buffer.concat(chunks);
      const header = (name: string) => request.headers[name] as string | undefined;
      const problem = signatureProblem(OUT_SECRET, { signature: header("x-keel-signature"), timestamp: header("x-keel-timestamp") }, raw, Date.now());
      received.push({ headers: request.headers, body: JSON.parse(raw.toString("utf8")) as Record<string, unknown>, signatureProblem: problem });
      const answer = behaviour();
      if (answer === "stall") stalled.push(response);
      else if (answer === "reset") request.socket.destroy();
      else response.writeHead(answer === "ok" ? 200 : answer, { "x-request-id": `peer-${received.length}` }).end("{}");
    });
  });
  server.on("close", () => stalled.forEach((response) => response.destroy()));
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, received };
}

const closePeer = (server: Server) => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); });

/** Submits one message for `connector` (ack, reply, ack: three emissions). */
async function submit(connector: string, text = "hello"): Promise<string> {
  const response = await clients.ingress.submitMessage({ agentId: "demo", conversationId: `c-${randomUUID()}`, actor: { id: "alice" }, messageId: randomUUID(), text, connector });
  return response.runId;
}

/** The first `count` emissions of `connector`, as Keel holds them now. */
async function emissionsOf(connector: string, count: number): Promise<Emission[]> {
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

type Options = Partial<OutboundOptions> & { connector: string; targetUrl: string };

/** The outbound side running in the background, its state file named after its connector. */
function startOutbound(options: Options): { events: OutboundEvent[]; stop(): Promise<void> } {
  const events: OutboundEvent[] = [];
  const abort = new AbortController();
  const running = runOutbound(
    { emissions: clients.emissions, secret: OUT_SECRET, stateFile: path.join(dir, `${options.connector}.json`), timeoutMs: 2_000, backoffMs: 50, ...options, onEvent: (event) => events.push(event) },
    abort.signal,
  );
  return {
    events,
    stop: async () => {
      abort.abort();
      await running;
    },
  };
}

/** Runs the outbound side until `done(events)`; returns the events. */
async function runUntil(options: Options, done: (events: OutboundEvent[]) => boolean): Promise<OutboundEvent[]> {
  const outbound = startOutbound(options);
  try {
    await waitFor("the outbound connector", async () => (done(outbound.events) ? true : undefined), 20_000);
  } finally {
    await outbound.stop();
  }
  return outbound.events;
}

const attempts = (events: OutboundEvent[], kind: "not-sent" | "ambiguous" | "response") =>
  events.filter((event) => event.type === "attempt" && event.outcome.kind === kind);

const settled = (events: OutboundEvent[]) => events.filter((event) => event.type === "settled");
/** What one answered message emits: ⏳ working, 👀 started, 🧠 thinking, the reply, ✅ succeeded. */
const PER_RUN = 5;
const KINDS = ["EMISSION_KIND_ACK", "EMISSION_KIND_ACK", "EMISSION_KIND_ACK", "EMISSION_KIND_REPLY", "EMISSION_KIND_ACK"];
const times = <T>(n: number, value: T): T[] => Array.from({ length: n }, () => value);
const statuses = (emissions: Emission[]) => emissions.map((emission) => DeliveryStatus[emission.deliveryStatus]);

describe("webhook in", () => {
  let url: string;
  let server: Server;
  beforeAll(async () => {
    server = createServer(createInboundHandler({ ingress: clients.ingress, secret: IN_SECRET, agentId: "demo", connector: "wh-in" }));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  });
  afterAll(() => closePeer(server));

  const send = (body: string, { secret = IN_SECRET, timestamp = String(Math.floor(Date.now() / 1000)), signature }: { secret?: string; timestamp?: string; signature?: string } = {}) =>
    fetch(url, { method: "POST", body, headers: { "x-keel-timestamp": timestamp, "x-keel-signature": signature ?? sign(secret, timestamp, body) } });

  it("turns a signed POST into a message, once per message id", async () => {
    const body = JSON.stringify({ conversation_id: "wh-conv", message_id: "m-1", actor: "alice", text: "from the web" });
    const first = await send(body);
    expect(first.status).toBe(202);
    const accepted = (await first.json()) as { run_id: string; duplicate: boolean };
    expect(accepted.duplicate).toBe(false);
    const again = (await (await send(body)).json()) as { run_id: string; duplicate: boolean };
    expect(again).toEqual({ run_id: accepted.run_id, duplicate: true });
    const emissions = await emissionsOf("wh-in", PER_RUN);
    expect(emissions.map((emission) => emission.runId)).toEqual(times(PER_RUN, accepted.run_id));
    expect(emissions.find((emission) => emission.kind === EmissionKind.REPLY)?.text).toContain("from the web");
  });

  it("refuses a wrong or stale signature with 401 and bad JSON with 400 naming the field", async () => {
    const body = JSON.stringify({ conversation_id: "wh-conv", message_id: "m-2", actor: "alice", text: "x" });
    expect((await send(body, { secret: "not-the-secret" })).status).toBe(401);
    expect((await send(body, { signature: "sha256=00" })).status).toBe(401);
    const stale = String(Math.floor(Date.now() / 1000) - 6 * 60);
    const staleResponse = await send(body, { timestamp: stale });
    expect(staleResponse.status).toBe(401);
    expect(((await staleResponse.json()) as { error: string }).error).toMatch(/5-minute window/);
    const notJson = await send("{not json");
    expect(notJson.status).toBe(400);
    expect(((await notJson.json()) as { error: string }).error).toMatch(/not JSON/);
    const noText = await send(JSON.stringify({ conversation_id: "c", message_id: "m-3", actor: "alice" }));
    expect(noText.status).toBe(400);
    expect(((await noText.json()) as { error: string }).error).toMatch(/^text /);
    const badActor = await send(JSON.stringify({ conversation_id: "c", message_id: "m-3", actor: 7, text: "x" }));
    expect(((await badActor.json()) as { error: string }).error).toMatch(/^actor /);
    // Keel's own validation keeps its meaning: a message id with a space is the caller's mistake.
    const keelRefuses = await send(JSON.stringify({ conversation_id: "c", message_id: "m 3", actor: "alice", text: "x" }));
    expect(keelRefuses.status).toBe(400);
    expect(((await keelRefuses.json()) as { error: string }).error).toMatch(/message_id/);
  });
});

describe("webhook out", () => {
  it("POSTs each emission once, signed, with its idempotency key; a restart or a rewind sends nothing again", async () => {
    const peer = await startPeer(() => "ok");
    try {
      await submit("wh-ok", "deliver me");
      const events = await runUntil({ connector: "wh-ok", targetUrl: peer.url }, (seen) => settled(seen).length === PER_RUN);
      expect(settled(events).map((event) => event.type === "settled" && event.status)).toEqual(times(PER_RUN, "delivered"));
      expect(peer.received).toHaveLength(PER_RUN);
      expect(peer.received.map((request) => request.signatureProblem)).toEqual(times(PER_RUN, undefined));
      expect(peer.received.map((request) => request.body["kind"])).toEqual(KINDS);
      expect(peer.received[KINDS.indexOf("EMISSION_KIND_REPLY")]?.body["text"]).toContain("deliver me");
      const keys = peer.received.map((request) => request.headers["idempotency-key"]);
      expect(new Set(keys).size).toBe(PER_RUN);
      expect(keys).toEqual(peer.received.map((request) => request.body["idempotency_key"]));
      const held = await emissionsOf("wh-ok", PER_RUN);
      expect(statuses(held)).toEqual(times(PER_RUN, "DELIVERED"));
      expect(held.map((emission) => emission.remoteRef)).toEqual(Array.from({ length: PER_RUN }, (_, i) => `peer-${i + 1}`));
      const state = JSON.parse(await readFile(path.join(dir, "wh-ok.json"), "utf8")) as { after_seq: number; in_flight: unknown };
      expect(state).toEqual({ after_seq: Number(held[PER_RUN - 1]?.seq), in_flight: null });

      // A second message after a restart: only it is sent (the cursor held).
      await submit("wh-ok", "second");
      await runUntil({ connector: "wh-ok", targetUrl: peer.url }, (seen) => settled(seen).length === PER_RUN);
      expect(peer.received).toHaveLength(2 * PER_RUN);

      // Rewound to zero (state file lost): everything is settled, so nothing is sent again.
      await rm(path.join(dir, "wh-ok.json"));
      const rewound = await runUntil({ connector: "wh-ok", targetUrl: peer.url }, (seen) => seen.filter((event) => event.type === "skipped").length === 2 * PER_RUN);
      expect(settled(rewound)).toEqual([]);
      expect(peer.received).toHaveLength(2 * PER_RUN);
    } finally {
      await closePeer(peer.server);
    }
  });

  it("retries while the connection is refused, then delivers each emission exactly once", async () => {
    const port = await freePort();
    await submit("wh-refused");
    const outbound = startOutbound({ connector: "wh-refused", targetUrl: `http://127.0.0.1:${port}/hook`, backoffMs: 100, maxAttempts: 30 });
    let peer: Awaited<ReturnType<typeof startPeer>> | undefined;
    try {
      await waitFor("three refused attempts", async () => (attempts(outbound.events, "not-sent").length >= 3 ? true : undefined));
      expect(attempts(outbound.events, "not-sent")[0]).toMatchObject({ outcome: { reason: "ECONNREFUSED" } });
      peer = await startPeer(() => "ok", port);
      await waitFor("every delivery", async () => (settled(outbound.events).length === PER_RUN ? true : undefined));
    } finally {
      await outbound.stop();
      if (peer !== undefined) await closePeer(peer.server);
    }
    expect(peer.received).toHaveLength(PER_RUN);
    expect(new Set(peer.received.map((request) => request.body["id"])).size).toBe(PER_RUN);
    expect(statuses(await emissionsOf("wh-refused", PER_RUN))).toEqual(times(PER_RUN, "DELIVERED"));
  });

  it("gives up as FAILED when the host name never resolves, after its bounded attempts", async () => {
    await submit("wh-dns");
    const events = await runUntil({ connector: "wh-dns", targetUrl: "http://keel-webhook-peer.invalid/hook", backoffMs: 10, maxAttempts: 2 }, (seen) => settled(seen).length === PER_RUN);
    expect(attempts(events, "not-sent")).toHaveLength(2 * PER_RUN);
    expect(attempts(events, "not-sent")[0]).toMatchObject({ outcome: { reason: expect.stringMatching(/ENOTFOUND|EAI_AGAIN/) as unknown } });
    const held = await emissionsOf("wh-dns", PER_RUN);
    expect(statuses(held)).toEqual(times(PER_RUN, "FAILED"));
  });

  it("records a stall after sending as AMBIGUOUS and never sends it again", async () => {
    const peer = await startPeer(() => "stall");
    try {
      await submit("wh-stall");
      const events = await runUntil({ connector: "wh-stall", targetUrl: peer.url, timeoutMs: 300 }, (seen) => settled(seen).length === PER_RUN);
      expect(attempts(events, "ambiguous")).toHaveLength(PER_RUN);
      expect(peer.received).toHaveLength(PER_RUN);
      expect(statuses(await emissionsOf("wh-stall", PER_RUN))).toEqual(times(PER_RUN, "AMBIGUOUS"));
      // Rewound: an ambiguous emission is not offered to the peer again.
      await rm(path.join(dir, "wh-stall.json"));
      await runUntil({ connector: "wh-stall", targetUrl: peer.url, timeoutMs: 300 }, (seen) => seen.filter((event) => event.type === "skipped").length === PER_RUN);
      expect(peer.received).toHaveLength(PER_RUN);
    } finally {
      await closePeer(peer.server);
    }
  });

  it("records a reset after the peer read the request as AMBIGUOUS, 4xx as FAILED and 5xx as AMBIGUOUS", async () => {
    const answers: Behaviour[] = ["reset", 422, 503];
    const peer = await startPeer(() => answers.shift() ?? "ok");
    try {
      await submit("wh-mixed");
      const events = await runUntil({ connector: "wh-mixed", targetUrl: peer.url }, (seen) => settled(seen).length === PER_RUN);
      expect(peer.received).toHaveLength(PER_RUN);
      expect(attempts(events, "ambiguous")).toHaveLength(1);
      const held = await emissionsOf("wh-mixed", PER_RUN);
      expect(statuses(held)).toEqual(["AMBIGUOUS", "FAILED", "AMBIGUOUS", "DELIVERED", "DELIVERED"]);
    } finally {
      await closePeer(peer.server);
    }
  });

  it("marks the emission it was sending when it stopped AMBIGUOUS on restart, without sending it", async () => {
    const peer = await startPeer(() => "ok");
    try {
      const runId = await submit("wh-crash");
      const [first] = await emissionsOf("wh-crash", 1);
      expect(first?.runId).toBe(runId);
      // What a connector killed between its POST and its AcknowledgeEmission leaves behind.
      await writeFile(path.join(dir, "wh-crash.json"), JSON.stringify({ after_seq: 0, in_flight: { emissionId: first?.id, seq: Number(first?.seq) } }));
      const events = await runUntil({ connector: "wh-crash", targetUrl: peer.url }, (seen) => settled(seen).length === PER_RUN);
      expect(settled(events)[0]).toMatchObject({ emissionId: first?.id, status: "ambiguous" });
      expect(peer.received.map((request) => request.body["id"])).not.toContain(first?.id);
      expect(peer.received).toHaveLength(PER_RUN - 1);
      expect(statuses(await emissionsOf("wh-crash", PER_RUN))).toEqual(["AMBIGUOUS", ...times(PER_RUN - 1, "DELIVERED")]);
    } finally {
      await closePeer(peer.server);
    }
  });
});
