// What a client without a token can make the server do (issue #12, item 5): a call is refused
// from its headers alone, before its body is read; /metrics needs a token; HTTP/2 connections
// are bounded in streams, header bytes, count per address and idle time. A real server, raw
// node:http2 sessions where the wire matters, and real grpc-js / Connect / gRPC-Web clients.
import http2 from "node:http2";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_UNAUTHENTICATED_PER_CONNECTION } from "../control-plane/src/api/auth-gate.js";
import { refusalPace } from "../control-plane/src/api/refusal-pacer.js";
import { intakeBudget } from "../control-plane/src/api/unproven-intake.js";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { startListeningKeel, type ListeningKeel } from "./support/tls-keel.js";

const FOUR_MIB = 4 * 1024 * 1024;
const MAX_SESSIONS = 6;

/** A gRPC frame header announcing a message of `length` bytes (uncompressed). */
function grpcPrefix(length: number): Buffer {
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(length, 1);
  return prefix;
}

function connectSession(url: string): Promise<http2.ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    session.once("error", reject);
    session.once("remoteSettings", () => resolve(session));
  });
}

interface Answer {
  readonly headers: http2.IncomingHttpHeaders & http2.IncomingHttpStatusHeader;
  readonly endStream: boolean;
  readonly body: string;
  readonly rstCode: number | undefined;
}

/**
 * Sends the headers and the first 64 KiB of a body announced as 4 MiB, and never the rest: only
 * a server that decides from the headers can answer. Resolves with the answer, or undefined if
 * none came within `waitMs`.
 */
function unfinishedUpload(session: http2.ClientHttp2Session, path: string, headers: Record<string, string>, waitMs: number): Promise<Answer | undefined> {
  return new Promise((resolve) => {
    const stream = session.request({ ":method": "POST", ":path": path, te: "trailers", ...headers });
    const isGrpc = headers["content-type"]?.startsWith("application/grpc") === true;
    stream.write(Buffer.concat([isGrpc ? grpcPrefix(FOUR_MIB) : Buffer.alloc(0), Buffer.alloc(64 * 1024, 7)]));
    let answer: Omit<Answer, "rstCode"> | undefined;
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      resolve(undefined);
    }, waitMs);
    stream.on("response", (responseHeaders, flags) => {
      answer = { headers: responseHeaders, endStream: (flags & http2.constants.NGHTTP2_FLAG_END_STREAM) !== 0, body: "" };
    });
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    stream.on("error", () => {});
    stream.on("close", () => {
      clearTimeout(timer);
      resolve(answer === undefined ? undefined : { ...answer, body: Buffer.concat(chunks).toString("latin1"), rstCode: stream.rstCode });
    });
  });
}

/** A unary gRPC call with an empty message on a raw session; resolves with its grpc-status, or undefined if it got none. */
function rawCall(session: http2.ClientHttp2Session, path: string, token?: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    let status: string | undefined;
    let stream: http2.ClientHttp2Stream;
    try {
      stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) });
    } catch {
      resolve(undefined); // the session is already closed
      return;
    }
    const take = (headers: http2.IncomingHttpHeaders) => (status ??= headers["grpc-status"] as string | undefined);
    stream.on("response", take);
    stream.on("trailers", take);
    stream.on("error", () => {});
    stream.on("close", () => resolve(status));
    stream.resume();
    stream.end(grpcPrefix(0));
  });
}

/** A grpc-js unary call to RunService.ListRuns with an empty request; resolves with its status code. */
function grpcJsListRuns(client: grpc.Client, token: string): Promise<grpc.status> {
  return new Promise((resolve) => {
    const metadata = new grpc.Metadata();
    metadata.set("authorization", `Bearer ${token}`);
    client.makeUnaryRequest("/keel.v1.RunService/ListRuns", () => Buffer.alloc(0), (b: Buffer) => b, {}, metadata, { deadline: Date.now() + 20_000 }, (error) =>
      resolve(error?.code ?? grpc.status.OK),
    );
  });
}

describe("limits a client without a token meets", () => {
  let keel: ListeningKeel;

  beforeAll(async () => {
    keel = await startListeningKeel({ env: { KEEL_MAX_SESSIONS_PER_ADDRESS: String(MAX_SESSIONS), KEEL_HTTP2_IDLE_TIMEOUT_MS: "1000" } });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  it("refuses an unauthenticated 4 MiB gRPC upload as Unauthenticated before reading its body", async () => {
    const session = await connectSession(keel.url);
    try {
      const path = "/keel.v1.IngressService/SubmitMessage";
      const refused = await unfinishedUpload(session, path, { "content-type": "application/grpc" }, 5_000);
      // Trailers-only: one header block with the status, ending the stream; then a reset
      // (NO_ERROR) that tells the client to stop sending the rest.
      expect(refused?.headers["grpc-status"]).toBe(String(Code.Unauthenticated));
      expect(decodeURIComponent(String(refused?.headers["grpc-message"]))).toMatch(/missing bearer token/);
      expect(refused?.endStream).toBe(true);
      expect(refused?.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);

      const unknown = await unfinishedUpload(session, path, { "content-type": "application/grpc", authorization: "Bearer keel_made_up" }, 5_000);
      expect(unknown?.headers["grpc-status"]).toBe(String(Code.Unauthenticated));

      // The control: with a real token the same unfinished upload gets no answer, because the
      // server (rightly) waits for the whole message. The refusals above came from headers alone.
      const authorized = await unfinishedUpload(session, path, { "content-type": "application/grpc", authorization: `Bearer ${keel.tokens.connector}` }, 1_000);
      expect(authorized).toBeUndefined();
    } finally {
      session.close();
    }
  });

  it("refuses an unauthenticated Connect upload with the Connect JSON error, also before the body", async () => {
    const session = await connectSession(keel.url);
    try {
      const refused = await unfinishedUpload(session, "/keel.v1.IngressService/SubmitMessage", { "content-type": "application/proto" }, 5_000);
      expect(refused?.headers[":status"]).toBe(401);
      expect(JSON.parse(refused?.body ?? "{}")).toEqual({ code: "unauthenticated", message: "missing bearer token (authorization: Bearer <token>)" });
    } finally {
      session.close();
    }
  });

  it("answers every client protocol's unauthenticated call with its own Unauthenticated", async () => {
    const calls = [
      () => createClient(RunService, createConnectTransport({ baseUrl: keel.url, httpVersion: "2" })).listRuns({}),
      () => createClient(RunService, createConnectTransport({ baseUrl: keel.http1Url, httpVersion: "1.1" })).listRuns({}),
      () => createClient(RunService, createGrpcTransport({ baseUrl: keel.url })).listRuns({}),
      () => createClient(RunService, createGrpcWebTransport({ baseUrl: keel.url, httpVersion: "2" })).listRuns({}),
      async () => {
        // A Connect server stream: the error arrives in the end-of-stream message.
        const client = createClient(EmissionService, createConnectTransport({ baseUrl: keel.url, httpVersion: "2" }));
        for await (const _ of client.subscribe({ connector: "c" })) break;
      },
    ];
    for (const call of calls) {
      const error = await call().then(() => undefined, (e: unknown) => ConnectError.from(e));
      expect(error?.code).toBe(Code.Unauthenticated);
    }
    const grpcJs = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
    try {
      const status = await new Promise<grpc.ServiceError>((resolve) => {
        grpcJs.makeUnaryRequest("/keel.v1.RunService/ListRuns", () => Buffer.alloc(0), (b: Buffer) => b, {}, (error) => resolve(error!));
      });
      expect(status.code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      grpcJs.close();
    }
  });

  it("keeps reflection public", async () => {
    const session = await connectSession(keel.url);
    try {
      const stream = session.request({ ":method": "POST", ":path": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "content-type": "application/grpc", te: "trailers" });
      const status = await new Promise<string | undefined>((resolve) => {
        stream.on("response", (headers) => resolve(headers["grpc-status"] as string | undefined));
        stream.end();
      });
      expect(status).not.toBe(String(Code.Unauthenticated));
      stream.close();
    } finally {
      session.close();
    }
  });

  it("serves /metrics only to an operator or admin token", async () => {
    const scrape = (token?: string) => fetch(`${keel.http1Url}/metrics`, { headers: token === undefined ? {} : { authorization: `Bearer ${token}` } });
    expect((await scrape()).status).toBe(401);
    expect((await scrape("keel_made_up")).status).toBe(401);
    expect((await scrape(keel.tokens.connector)).status).toBe(403);
    const operator = await scrape(keel.tokens.operator);
    expect(operator.status).toBe(200);
    expect(await operator.text()).toMatch(/^# (HELP|TYPE) /m);
    expect((await scrape(keel.tokens.admin)).status).toBe(200);
    expect((await fetch(`${keel.http1Url}/healthz`)).status).toBe(200);
  });

  it("gives a connection its large receive windows only once it made an authorized call", async () => {
    const session = await connectSession(keel.url);
    try {
      // A client without a valid token can push 16 KiB per stream at most.
      expect(session.remoteSettings.initialWindowSize).toBe(16 * 1024);
      const widened = new Promise<http2.Settings>((resolve) => session.once("remoteSettings", resolve));
      expect(await rawCall(session, "/keel.v1.RunService/ListRuns", keel.tokens.operator)).toBe("0");
      expect((await widened).initialWindowSize).toBe(4 * 1024 * 1024);
    } finally {
      session.close();
    }
  });

  it("sheds a connection after its unauthenticated calls, while an authorized grpc-js connection keeps working", async () => {
    const LIST_RUNS = "/keel.v1.RunService/ListRuns";
    const authorized = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
    const attacker = await connectSession(keel.url);
    try {
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      const goaway = new Promise<number>((resolve) => attacker.once("goaway", resolve));
      const closed = new Promise<void>((resolve) => attacker.once("close", resolve));
      attacker.on("error", () => {});
      // More calls than the limit, all sent at once (some without a token, some with secrets of a
      // shape Keel never issues): the first ones are refused, and calls still open when the
      // server sheds the connection end with it, without taking the server down.
      const statuses = await Promise.all(
        Array.from({ length: MAX_UNAUTHENTICATED_PER_CONNECTION + 40 }, (_, i) => rawCall(attacker, LIST_RUNS, i % 2 === 0 ? undefined : `made-up-${i}`)),
      );
      expect(await goaway).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      await closed;
      const refused = statuses.filter((status) => status === String(Code.Unauthenticated)).length;
      expect(refused).toBeGreaterThanOrEqual(MAX_UNAUTHENTICATED_PER_CONNECTION);
      expect(statuses.every((status) => status === undefined || status === String(Code.Unauthenticated))).toBe(true);

      // A client that resets its calls with an error code right after sending them (as Node's own
      // client does when its buffers overflow), before or after the refusal: the server shrugs it off.
      const resetter = await connectSession(keel.url);
      resetter.on("error", () => {});
      try {
        const resets = Array.from({ length: 10 }, (_, i) => {
          const stream = resetter.request({ ":method": "POST", ":path": LIST_RUNS, "content-type": "application/grpc", te: "trailers" });
          stream.on("error", () => {});
          stream.write(grpcPrefix(FOUR_MIB));
          return new Promise<number | undefined>((resolve) => {
            if (i % 2 === 0) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
            else stream.once("response", () => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
            stream.once("close", () => resolve(stream.rstCode));
          });
        });
        // Every stream ends reset (by whichever side's reset came first); what matters is below:
        // the server is still up and serving.
        expect((await Promise.all(resets)).every((code) => code !== undefined)).toBe(true);
      } finally {
        resetter.destroy();
      }

      // The authorized client's own connection was never touched: it goes on as before.
      for (let i = 0; i < 3; i++) expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      // A connection with a few unauthenticated calls among authorized ones stays open.
      const mixed = await connectSession(keel.url);
      try {
        for (let i = 0; i < 5; i++) {
          expect(await rawCall(mixed, LIST_RUNS)).toBe(String(Code.Unauthenticated));
          expect(await rawCall(mixed, LIST_RUNS, keel.tokens.operator)).toBe("0");
        }
        expect(mixed.closed || mixed.destroyed).toBe(false);
      } finally {
        mixed.close();
      }
    } finally {
      attacker.destroy();
      authorized.close();
    }
  });

  it("advertises its HTTP/2 limits and closes connections past the per-address cap", async () => {
    const first = await connectSession(keel.url);
    expect(first.remoteSettings.maxConcurrentStreams).toBe(1_000);
    expect(first.remoteSettings.maxHeaderListSize).toBe(16 * 1024);
    const sessions = [first];
    const closed = new Set<http2.ClientHttp2Session>();
    try {
      for (let i = 0; i < MAX_SESSIONS + 2; i++) {
        const session = http2.connect(keel.url);
        session.on("error", () => {});
        session.on("close", () => closed.add(session));
        sessions.push(session);
        await new Promise((resolve) => {
          session.once("remoteSettings", resolve);
          session.once("close", resolve);
        });
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
      const open = sessions.filter((session) => !closed.has(session) && !session.closed && !session.destroyed);
      expect(open.length).toBeLessThanOrEqual(MAX_SESSIONS);
      expect(closed.size).toBeGreaterThanOrEqual(2);
    } finally {
      for (const session of sessions) session.destroy();
    }
  });

  it("closes an idle connection, and keeps one with an open stream", async () => {
    // Let the server count the connections the last test dropped, so these two are admitted.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const started = Date.now();
    const idle = http2.connect(keel.url);
    const idleClosed = new Promise<number>((resolve) => idle.once("close", () => resolve(Date.now() - started)));
    idle.on("error", () => {});
    const busy = await connectSession(keel.url);
    try {
      // An authorized upload that never finishes keeps a stream open on `busy`.
      const pending = unfinishedUpload(busy, "/keel.v1.IngressService/SubmitMessage", { "content-type": "application/grpc", authorization: `Bearer ${keel.tokens.connector}` }, 3_000);
      const idleFor = await idleClosed;
      expect(idleFor).toBeGreaterThanOrEqual(900); // closed for idling (1 s here), not refused
      expect(idleFor).toBeLessThan(3_000);
      expect(busy.closed || busy.destroyed).toBe(false);
      expect(await pending).toBeUndefined();
    } finally {
      idle.destroy();
      busy.destroy();
    }
  });
});

describe("the pace of refusals", () => {
  const REFUSALS_PER_SECOND = 200;
  let keel: ListeningKeel;

  beforeAll(async () => {
    // The pace alone: no connection here is held for exceeding the refusal budget.
    keel = await startListeningKeel({ env: { KEEL_REFUSALS_PER_SECOND: String(REFUSALS_PER_SECOND), KEEL_REFUSAL_BUDGET_PER_SECOND: "1000000" } });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  it("answers a flood of unauthenticated calls at a bounded rate, each still with Unauthenticated", async () => {
    const LIST_RUNS = "/keel.v1.RunService/ListRuns";
    const { perSecond, burst } = refusalPace(REFUSALS_PER_SECOND);
    const perConnection = MAX_UNAUTHENTICATED_PER_CONNECTION - 4; // under the shed limit: every call gets its answer
    const connections = await Promise.all(Array.from({ length: 3 }, () => connectSession(keel.url)));
    const authorized = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
    try {
      const started = performance.now();
      const answered: number[] = [];
      const flood = Promise.all(
        connections.flatMap((session) =>
          Array.from({ length: perConnection }, async () => {
            const status = await rawCall(session, LIST_RUNS);
            answered.push(performance.now() - started);
            return status;
          }),
        ),
      );
      // An authorized call while the refusals wait: the pace is only for calls without a valid token.
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      const authorizedAt = performance.now() - started;
      const statuses = await flood;
      const total = connections.length * perConnection;
      expect(statuses.filter((status) => status === String(Code.Unauthenticated))).toHaveLength(total);
      // Past the burst, answers come at the pace: the last cannot come sooner than this.
      const floor = ((total - burst) / perSecond) * 1000;
      expect(Math.max(...answered)).toBeGreaterThanOrEqual(floor * 0.9);
      // ...and the burst went out at once, well before the rest.
      expect(answered.sort((a, b) => a - b)[burst - 1]).toBeLessThan(floor / 2);
      expect(authorizedAt).toBeLessThan(Math.max(...answered));
    } finally {
      authorized.close();
      await Promise.all(connections.map((session) => new Promise((resolve) => session.close(() => resolve(undefined)))));
    }
  });
});

describe("the refusal budget", () => {
  const BUDGET_PER_SECOND = 2;
  const LIST_RUNS = "/keel.v1.RunService/ListRuns";
  let keel: ListeningKeel;

  beforeAll(async () => {
    keel = await startListeningKeel({ env: { KEEL_REFUSAL_BUDGET_PER_SECOND: String(BUDGET_PER_SECOND) } });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  /** The call's status, or "no answer" when none came within `ms`. */
  const within = (call: Promise<string | undefined>, ms: number) =>
    Promise.race([call, new Promise<string>((resolve) => setTimeout(() => resolve("no answer"), ms))]);
  /** The concurrency limit the server last told `session`, once it has told it `expected` or after 2 s. */
  const advertised = (session: http2.ClientHttp2Session, expected: number) =>
    new Promise<number | undefined>((resolve) => {
      if (session.remoteSettings.maxConcurrentStreams === expected) return resolve(expected);
      const timer = setTimeout(() => resolve(session.remoteSettings.maxConcurrentStreams), 2_000);
      session.on("remoteSettings", (settings: http2.Settings) => {
        if (settings.maxConcurrentStreams !== expected) return;
        clearTimeout(timer);
        resolve(expected);
      });
    });

  it("holds unread a connection refused past the budget, and keeps serving everyone else", async () => {
    const authorized = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
    const proven = await connectSession(keel.url);
    const attacker = await connectSession(keel.url);
    const sessions = [proven, attacker];
    try {
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      // A connection that made an authorized call is never held, whatever it sends later.
      expect(await rawCall(proven, LIST_RUNS, keel.tokens.operator)).toBe("0");

      // Within the budget every refusal is answered; the one past it still is, and then the
      // connection is held: told to open no more streams, and not read.
      for (let i = 0; i <= BUDGET_PER_SECOND; i++) expect(await rawCall(attacker, LIST_RUNS)).toBe(String(Code.Unauthenticated));
      expect(await advertised(attacker, 0)).toBe(0);

      // A new connection is still read and answered while the budget is spent (it refills a
      // token every 500 ms), then held too.
      const late = await connectSession(keel.url);
      sessions.push(late);
      expect(await rawCall(late, LIST_RUNS)).toBe(String(Code.Unauthenticated));
      expect(await advertised(late, 0)).toBe(0);
      expect(await within(rawCall(attacker, LIST_RUNS), 1_000)).toBe("no answer");

      // Authorized clients never notice: the connection from before, the proven raw one (its
      // own refusals still answered), and a new one whose first call is authorized.
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      for (let i = 0; i < 3; i++) expect(await rawCall(proven, LIST_RUNS)).toBe(String(Code.Unauthenticated));
      expect(await rawCall(proven, LIST_RUNS, keel.tokens.operator)).toBe("0");
      const fresh = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
      try {
        expect(await grpcJsListRuns(fresh, keel.tokens.operator)).toBe(grpc.status.OK);
      } finally {
        fresh.close();
      }

      // A budget, not a ban: once it refills, a refused connection is answered and left open.
      await new Promise((resolve) => setTimeout(resolve, 1_200));
      const after = await connectSession(keel.url);
      sessions.push(after);
      expect(await rawCall(after, LIST_RUNS)).toBe(String(Code.Unauthenticated));
      expect(await rawCall(after, LIST_RUNS)).toBe(String(Code.Unauthenticated));
      expect(after.remoteSettings.maxConcurrentStreams).toBeGreaterThan(0);
    } finally {
      for (const session of sessions) session.destroy();
      authorized.close();
    }
  });

  it("parks new connections from an address with enough connections held, before any HTTP/2", async () => {
    const { parkAfterHeld } = intakeBudget(BUDGET_PER_SECOND);
    const authorized = new grpc.Client(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
    const flood = await Promise.all(Array.from({ length: parkAfterHeld + 8 }, () => connectSession(keel.url)));
    const sessions = [...flood];
    try {
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
      // Each floods one refused call at once: past the budget's few, the connections are held.
      await Promise.all(flood.map((session) => within(rawCall(session, LIST_RUNS), 1_000)));
      const held = (await Promise.all(flood.map((session) => advertised(session, 0)))).filter((limit) => limit === 0);
      expect(held.length).toBeGreaterThanOrEqual(parkAfterHeld);

      // From this address a new connection is now accepted and never read: the server sends it
      // nothing, not even its SETTINGS, and answers none of its calls.
      const parked = http2.connect(keel.url);
      sessions.push(parked);
      parked.on("error", () => {});
      const settings = await within(new Promise((resolve) => parked.once("remoteSettings", () => resolve("settings"))), 1_000);
      expect(settings).toBe("no answer");
      expect(await within(rawCall(parked, LIST_RUNS), 500)).toBe("no answer");

      // The authorized connection made before goes on as ever. (Held connections are not read,
      // so their clients leaving is not seen: the address's new connections stay parked until
      // the holds end, at most 30 s; the unit tests time that.)
      expect(await grpcJsListRuns(authorized, keel.tokens.operator)).toBe(grpc.status.OK);
    } finally {
      for (const session of sessions) session.destroy();
      authorized.close();
    }
  });
});
