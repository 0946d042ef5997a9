// A local Slack for connector tests, faithful to what Slack's node SDK expects (read from
// slackapi/node-slack-sdk: SocketModeClient.ts, SlackWebSocket.ts, WebClient.ts):
// - Web API: form-encoded POSTs to /api/<method>, the token as a bearer header, HTTP 200 with
//   `{ ok: false, error }` for refusals; apps.connections.open (app token only) hands out a one-use
//   wss-style URL; auth.test, chat.postMessage, reactions.add/remove (already_reacted, no_reaction).
// - Socket Mode: on connect a `hello`; events as `events_api` envelopes with an envelope_id that the
//   client acknowledges by sending `{ envelope_id, payload }` back; `disconnect` asks it to reconnect.
//   Like Slack, the bot's own posts come back to it as message events (with its bot_id).
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { WebSocketServer, type WebSocket } from "ws";

export const BOT_USER_ID = "UKEELBOT";
const BOT_ID = "BKEEL";
const TEAM_ID = "TFAKE";
const APP_ID = "AFAKE";

export interface SlackCall {
  readonly method: string;
  readonly args: Readonly<Record<string, string>>;
}

export interface Posted {
  readonly channel: string;
  readonly ts: string;
  readonly threadTs: string | undefined;
  readonly text: string;
}

export interface ReactionChange {
  readonly action: "add" | "remove";
  readonly channel: string;
  readonly ts: string;
  readonly name: string;
}

export interface FakeSlack {
  /** The Web API base to give the SDK as slackApiUrl. */
  readonly apiUrl: string;
  readonly appToken: string;
  readonly botToken: string;
  /** Every Web API call, in the order it arrived (including stalled ones). */
  readonly calls: SlackCall[];
  readonly posts: Posted[];
  readonly reactionChanges: ReactionChange[];
  /** How many Socket Mode connections were opened. */
  connections(): number;
  /** The reactions the message shows now. */
  reactionsOn(channel: string, ts: string): string[];
  /** A new message ts, as Slack would give a person's message. */
  nextTs(): string;
  /** Delivers an Events API event over Socket Mode; resolves once the client acknowledged it. */
  deliver(event: Record<string, unknown>, timeoutMs?: number): Promise<void>;
  /** Reads the next call of `method` and never answers it (the connection is held open). */
  stallNext(method: string): void;
  /** Answers the next call of `method` with this HTTP status (429 with Retry-After: 1) instead of acting on it. */
  failNext(method: string, status: number): void;
  /** Sends Slack's `disconnect` message on every open socket. */
  askToReconnect(): void;
  close(): Promise<void>;
}

export async function startFakeSlack(): Promise<FakeSlack> {
  const appToken = `xapp-1-${APP_ID}-${randomUUID()}`;
  const botToken = `xoxb-${randomUUID()}`;
  const calls: SlackCall[] = [];
  const posts: Posted[] = [];
  const reactionChanges: ReactionChange[] = [];
  const reactions = new Map<string, string[]>();
  const tickets = new Set<string>();
  const sockets = new Set<WebSocket>();
  const pendingAcks = new Map<string, () => void>();
  const stalls = new Map<string, number>();
  const failures = new Map<string, number[]>();
  const held: ServerResponse[] = [];
  let connectionCount = 0;
  let closed = false;
  let tsCounter = 0;
  const nextTs = () => `${1_800_000_000 + ++tsCounter}.${String(tsCounter).padStart(6, "0")}`;

  const server = createServer((request, response) => {
    void handleHttp(request, response);
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on("upgrade", (request, socket, head) => {
    const url = new URL(request.url ?? "/", "http://localhost");
    const ticket = url.searchParams.get("ticket") ?? "";
    if (url.pathname !== "/link/" || !tickets.delete(ticket)) {
      socket.end("HTTP/1.1 401 Unauthorized\r\n\r\n");
      return;
    }
    wss.handleUpgrade(request, socket, head, (ws) => {
      connectionCount++;
      sockets.add(ws);
      ws.on("close", () => sockets.delete(ws));
      ws.on("message", (data) => {
        const message = JSON.parse((data as Buffer).toString("utf8")) as { envelope_id?: string };
        if (message.envelope_id !== undefined) pendingAcks.get(message.envelope_id)?.();
      });
      ws.send(JSON.stringify({ type: "hello", num_connections: sockets.size, debug_info: { host: "fake-slack", build_number: 1, approximate_connection_time: 18_060 }, connection_info: { app_id: APP_ID } }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;

  async function handleHttp(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of request as AsyncIterable<Buffer>) chunks.push(chunk);
    const raw = Buffer.concat(chunks).toString("utf8");
    const args: Record<string, string> =
      request.headers["content-type"]?.startsWith("application/json") === true
        ? (JSON.parse(raw) as Record<string, string>)
        : Object.fromEntries(new URLSearchParams(raw));
    const method = (request.url ?? "").replace(/^\/api\//, "").split("?")[0] ?? "";
    calls.push({ method, args });
    const stalled = stalls.get(method) ?? 0;
    if (stalled > 0) {
      stalls.set(method, stalled - 1);
      held.push(response);
      return;
    }
    const failure = failures.get(method)?.shift();
    if (failure !== undefined) {
      response.writeHead(failure, failure === 429 ? { "retry-after": "1" } : {}).end(failure === 429 ? "" : "upstream trouble");
      return;
    }
    const token = (request.headers.authorization ?? "").replace(/^Bearer /, "") || (args["token"] ?? "");
    const answer = (body: Record<string, unknown>): void => {
      response.writeHead(200, { "content-type": "application/json; charset=utf-8" }).end(JSON.stringify(body));
    };
    if (method === "apps.connections.open") {
      if (token !== appToken) return answer({ ok: false, error: token.startsWith("xapp-") ? "invalid_auth" : "not_allowed_token_type" });
      const ticket = randomUUID();
      tickets.add(ticket);
      return answer({ ok: true, url: `ws://127.0.0.1:${port}/link/?ticket=${ticket}&app_id=${APP_ID}` });
    }
    if (token !== botToken) return answer({ ok: false, error: token.startsWith("xoxb-") ? "invalid_auth" : "not_allowed_token_type" });
    answer(webApi(method, args));
  }

  function webApi(method: string, args: Record<string, string>): Record<string, unknown> {
    switch (method) {
      case "auth.test":
        return { ok: true, url: "https://fake.slack.test/", team: "Fake", user: "keel", team_id: TEAM_ID, user_id: BOT_USER_ID, bot_id: BOT_ID, is_enterprise_install: false };
      case "chat.postMessage": {
        const { channel, text, thread_ts: threadTs } = args;
        if (channel === undefined || channel === "") return { ok: false, error: "channel_not_found" };
        if (text === undefined || text === "") return { ok: false, error: "no_text" };
        const ts = nextTs();
        posts.push({ channel, ts, threadTs, text });
        const message = { type: "message", text, user: BOT_USER_ID, bot_id: BOT_ID, ts, ...(threadTs === undefined ? {} : { thread_ts: threadTs }) };
        // Slack tells the app about its own message too; a connector must not take it as a person's.
        setImmediate(() => void deliver({ ...message, channel, channel_type: "channel" }).catch(() => undefined));
        return { ok: true, channel, ts, message };
      }
      case "reactions.add":
      case "reactions.remove": {
        const { channel, timestamp, name } = args;
        if (channel === undefined || timestamp === undefined || name === undefined) return { ok: false, error: "invalid_arguments" };
        const key = `${channel}:${timestamp}`;
        const shown = reactions.get(key) ?? [];
        const adding = method === "reactions.add";
        if (adding && shown.includes(name)) return { ok: false, error: "already_reacted" };
        if (!adding && !shown.includes(name)) return { ok: false, error: "no_reaction" };
        reactions.set(key, adding ? [...shown, name] : shown.filter((shownName) => shownName !== name));
        reactionChanges.push({ action: adding ? "add" : "remove", channel, ts: timestamp, name });
        return { ok: true };
      }
      default:
        return { ok: false, error: "unknown_method" };
    }
  }

  /** Like Slack, an envelope whose connection closed before its ack is sent again on another (retry_attempt + 1). */
  async function deliver(event: Record<string, unknown>, timeoutMs = 15_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const envelopeId = randomUUID();
    const eventId = `Ev${randomUUID().replace(/-/g, "").slice(0, 10).toUpperCase()}`;
    const now = Date.now() / 1000;
    for (let attempt = 0; ; attempt++) {
      let socket: WebSocket | undefined;
      while ((socket = [...sockets].find((candidate) => candidate.readyState === candidate.OPEN)) === undefined) {
        if (Date.now() > deadline || closed) throw new Error(`no Socket Mode connection to deliver ${String(event["type"])} to`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const open = socket;
      const outcome = await new Promise<"acked" | "closed" | "timeout">((resolve) => {
        const finish = (result: "acked" | "closed" | "timeout") => {
          clearTimeout(timer);
          pendingAcks.delete(envelopeId);
          open.off("close", onClose);
          resolve(result);
        };
        const onClose = () => finish("closed");
        const timer = setTimeout(() => finish("timeout"), Math.max(0, deadline - Date.now()));
        pendingAcks.set(envelopeId, () => finish("acked"));
        open.once("close", onClose);
        open.send(
          JSON.stringify({
            envelope_id: envelopeId,
            type: "events_api",
            accepts_response_payload: false,
            retry_attempt: attempt,
            retry_reason: attempt === 0 ? "" : "timeout",
            payload: {
              token: "verification-token",
              team_id: TEAM_ID,
              api_app_id: APP_ID,
              event: { ...event, event_ts: typeof event["ts"] === "string" ? event["ts"] : String(now) },
              type: "event_callback",
              event_id: eventId,
              event_time: Math.floor(now),
              authorizations: [{ team_id: TEAM_ID, user_id: BOT_USER_ID, is_bot: true }],
            },
          }),
        );
      });
      if (outcome === "acked") return;
      if (outcome === "timeout") throw new Error(`envelope ${envelopeId} (${String(event["type"])}) was not acknowledged`);
    }
  }

  return {
    apiUrl: `http://127.0.0.1:${port}/api/`,
    appToken,
    botToken,
    calls,
    posts,
    reactionChanges,
    connections: () => connectionCount,
    reactionsOn: (channel, ts) => [...(reactions.get(`${channel}:${ts}`) ?? [])],
    nextTs,
    deliver,
    stallNext: (method) => stalls.set(method, (stalls.get(method) ?? 0) + 1),
    failNext: (method, status) => failures.set(method, [...(failures.get(method) ?? []), status]),
    askToReconnect: () => sockets.forEach((ws) => ws.send(JSON.stringify({ type: "disconnect", reason: "refresh_requested", debug_info: { host: "fake-slack" } }))),
    close: async () => {
      closed = true;
      held.forEach((response) => response.destroy());
      sockets.forEach((ws) => ws.terminate());
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
