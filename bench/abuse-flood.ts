// The attacker of the abuse bench, run as its own process so its CPU and memory are not the
// server's: `node --import tsx bench/abuse-flood.ts URL MODE RATE UPLOADERS PER_CONNECTION`.
// It prints "ready" once its first connections are up and attacks until its stdin closes.
// MODE "spin" sends nothing and only keeps its CPU busy: the bench's control for what an attacker
// costs the machine (the other CPU's share of everyone else's work) rather than the server.
// MODE is "uploads" (unauthenticated 4 MiB bodies, 8 at a time on each of UPLOADERS connections),
// "tokens" (unary calls with random bearer tokens at RATE per second, in turn: of no Keel shape,
// of the issued shape with a made-up tag, and of the untagged shape of older secrets, the last
// two costing the server more than a glance) or "both". Prints one
// JSON line with what it sent and how the server answered. The attacker knows the server's
// limit of unauthenticated calls per connection: it moves to a fresh connection after
// PER_CONNECTION calls (and at once when the server says GOAWAY), so the server refuses every
// call rather than shedding most; the connections it opened are counted.
import { randomBytes } from "node:crypto";
import http2 from "node:http2";
import { performance } from "node:perf_hooks";

const PATH = "/keel.v1.IngressService/SubmitMessage";
const FOUR_MIB = 4 * 1024 * 1024;
const TOKEN_CONNECTIONS = 8;
const TICK_MS = 10;
/** Uploads each attacking connection keeps in flight at once. */
const UPLOADS_PER_CONNECTION = 8;
/**
 * The client's own buffer bound, in MiB. Node's default (10) would make the client reset most of
 * its 8 x 4 MiB uploads itself, with ENHANCE_YOUR_CALM, before the server saw them.
 */
const CLIENT_SESSION_MEMORY_MIB = 256;

interface Counts extends Record<string, number> {
  uploadsSent: number;
  uploadsRefused: number;
  /** Refused by a stream reset instead (e.g. ENHANCE_YOUR_CALM once the connection's memory budget is spent). */
  uploadsReset: number;
  tokenCallsSent: number;
  tokenCallsRefused: number;
  /** Answered with another status; which ones are counted under status_<code>. */
  tokenCallsOther: number;
  /** Calls that got no answer because the server closed their connection first (GOAWAY). */
  callsLostToGoaway: number;
  /** Connections opened, the first ones included. */
  connections: number;
  errors: number;
}

/** Every connection not yet closed, to be cut when the attack ends. */
const live = new Set<http2.ClientHttp2Session>();

/** A connection, and whether the server has told it to go away. */
interface Connection {
  readonly session: http2.ClientHttp2Session;
  goneAway: boolean;
  calls: number;
}

/** Calls the attacker sends on one connection before it opens the next; set from argv. */
let perConnection = Number.POSITIVE_INFINITY;

function connect(url: string, counts: Counts): Connection {
  const session = http2.connect(url, { maxSessionMemory: CLIENT_SESSION_MEMORY_MIB });
  counts.connections++;
  live.add(session);
  session.once("close", () => live.delete(session));
  const connection = { session, goneAway: false, calls: 0 };
  session.on("goaway", () => (connection.goneAway = true));
  session.on("error", () => {});
  return connection;
}

/**
 * A fresh connection when `connection` has had its calls. The old one is left to the server, which
 * closes it after its last refusal; closing it here could drop calls not yet sent on it.
 */
function rotate(url: string, connection: Connection, counts: Counts): Connection {
  return usable(connection) ? connection : connect(url, counts);
}

function usable(connection: Connection): boolean {
  return connection.calls < perConnection && !connection.goneAway && !connection.session.closed && !connection.session.destroyed;
}

/** One 4 MiB upload without a token; resolves when the server has answered and the stream ended. */
function upload(connection: Connection, body: Buffer, counts: Counts): Promise<void> {
  return new Promise((resolve) => {
    let stream: http2.ClientHttp2Stream;
    try {
      stream = connection.session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
    } catch {
      counts.errors++;
      resolve();
      return;
    }
    counts.uploadsSent++;
    connection.calls++;
    let answered = false;
    stream.on("response", (headers) => {
      answered = true;
      if (headers["grpc-status"] === "16") counts.uploadsRefused++;
      // Answered: drop the rest of the body. After the server's reset (NO_ERROR) Node keeps a
      // stream with an unsent write open for good; destroying it is what a client would do.
      setImmediate(() => stream.destroy());
    });
    // A stream on a connection the server closed may never be answered: give up on it.
    const guard = setTimeout(() => stream.destroy(), 2_000);
    stream.on("error", () => {});
    stream.on("close", () => {
      clearTimeout(guard);
      if (answered) {
        // counted above
      } else if (connection.goneAway) counts.callsLostToGoaway++;
      else if (stream.rstCode !== undefined && stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR && stream.rstCode !== http2.constants.NGHTTP2_CANCEL) counts.uploadsReset++;
      resolve();
    });
    stream.resume();
    stream.write(body);
    stream.end();
  });
}

/** Set when stdin closes: every loop ends. */
const attack = { on: true };

/** Resolves once `connection` is connected (or failed). */
function connected(connection: Connection): Promise<void> {
  return new Promise((resolve) => {
    connection.session.once("connect", () => resolve());
    connection.session.once("close", () => resolve());
  });
}

async function uploads(url: string, lanes: number, counts: Counts, ready: (first: Connection) => void): Promise<void> {
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(FOUR_MIB, 1);
  const body = Buffer.concat([prefix, Buffer.alloc(FOUR_MIB, 0x61)]);
  await Promise.all(
    Array.from({ length: lanes }, async () => {
      let connection = connect(url, counts);
      ready(connection);
      const inFlight = async () => {
        while (attack.on) {
          connection = rotate(url, connection, counts);
          await upload(connection, body, counts);
        }
      };
      await Promise.all(Array.from({ length: UPLOADS_PER_CONNECTION }, inFlight));
      connection.session.destroy();
    }),
  );
}

/** The nth made-up secret: the shapes an attacker who read Keel's source would try, in turn. */
function madeUpSecret(n: number): string {
  const random = randomBytes(33).toString("base64url");
  if (n % 3 === 0) return `keel_${random.slice(0, 32)}`;
  if (n % 3 === 1) return `keel_connector_${random.slice(0, 32)}${randomBytes(9).toString("base64url").slice(0, 11)}`;
  return `keel_connector_${random.slice(0, 32)}`;
}

function tokenCall(connection: Connection, counts: Counts): void {
  let stream: http2.ClientHttp2Stream;
  try {
    stream = connection.session.request({
      ":method": "POST",
      ":path": PATH,
      "content-type": "application/grpc",
      te: "trailers",
      authorization: `Bearer ${madeUpSecret(counts.tokenCallsSent)}`,
    });
  } catch {
    counts.errors++;
    return;
  }
  counts.tokenCallsSent++;
  connection.calls++;
  let answered = false;
  const settle = (status: unknown) => {
    if (answered) return;
    answered = true;
    if (status === "16") counts.tokenCallsRefused++;
    else if (status === undefined && connection.goneAway) counts.callsLostToGoaway++;
    else {
      counts.tokenCallsOther++;
      const key = `status_${typeof status === "string" ? status : "none"}`;
      counts[key] = (counts[key] ?? 0) + 1;
    }
  };
  stream.on("response", (headers) => {
    if (headers["grpc-status"] !== undefined) settle(headers["grpc-status"]);
  });
  stream.on("trailers", (trailers: http2.IncomingHttpHeaders) => settle(trailers["grpc-status"]));
  stream.on("error", () => {});
  stream.on("close", () => settle(undefined));
  stream.resume();
  stream.end(Buffer.alloc(5)); // an empty message
}

async function tokens(url: string, rate: number, counts: Counts, ready: (first: Connection) => void): Promise<void> {
  const connections = Array.from({ length: TOKEN_CONNECTIONS }, () => connect(url, counts));
  connections.forEach(ready);
  await Promise.all(connections.map(connected));
  const started = performance.now();
  let sent = 0;
  let next = 0;
  while (attack.on) {
    // Paced by the clock, not by answers: the attacker does not wait for the server.
    const due = Math.floor(((performance.now() - started) / 1000) * rate);
    for (; sent < due; sent++) {
      const connection = rotate(url, connections[next % connections.length]!, counts);
      connections[next % connections.length] = connection;
      next++;
      tokenCall(connection, counts);
    }
    await new Promise((resolve) => setTimeout(resolve, TICK_MS));
  }
  await new Promise((resolve) => setTimeout(resolve, 500));
  for (const connection of connections) connection.session.destroy();
}

/** Keeps this process's CPU busy, yielding every few milliseconds so stdin's end is seen. */
async function spin(): Promise<void> {
  while (attack.on) {
    const until = performance.now() + 5;
    while (performance.now() < until) {
      // busy
    }
    await new Promise((resolve) => setImmediate(resolve));
  }
}

async function main(): Promise<void> {
  const [url, mode, rate, lanes, calls] = process.argv.slice(2);
  if (url === undefined || (mode !== "uploads" && mode !== "tokens" && mode !== "both" && mode !== "spin")) {
    throw new Error("usage: abuse-flood.ts URL uploads|tokens|both|spin RATE UPLOADERS PER_CONNECTION");
  }
  if (calls !== undefined && Number(calls) > 0) perConnection = Number(calls);
  const counts: Counts = {
    uploadsSent: 0,
    uploadsRefused: 0,
    uploadsReset: 0,
    tokenCallsSent: 0,
    tokenCallsRefused: 0,
    tokenCallsOther: 0,
    callsLostToGoaway: 0,
    connections: 0,
    errors: 0,
  };
  process.stdin.resume();
  process.stdin.on("end", () => (attack.on = false));
  const first: Promise<void>[] = [];
  const ready = (connection: Connection) => first.push(connected(connection));
  const attacking = Promise.all([
    mode === "tokens" || mode === "spin" ? undefined : uploads(url, Number(lanes), counts, ready),
    mode === "uploads" || mode === "spin" ? undefined : tokens(url, Number(rate), counts, ready),
    mode === "spin" ? spin() : undefined,
  ]);
  await Promise.all(first);
  process.stdout.write("ready\n");
  await attacking;
  for (const session of live) session.destroy();
  process.stdout.write(`${JSON.stringify(counts)}\n`);
}

await main();
