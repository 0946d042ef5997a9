// The attacker of the abuse bench, run as its own process so its CPU and memory are not the
// server's: `node --import tsx bench/abuse-flood.ts URL MODE SECONDS RATE UPLOADERS`.
// MODE is "uploads" (unauthenticated 4 MiB bodies, 8 at a time on each of UPLOADERS connections),
// "tokens" (unary calls with random bearer tokens at RATE per second) or "both". Prints one
// JSON line with what it sent and how the server answered.
import { randomBytes } from "node:crypto";
import http2 from "node:http2";
import { performance } from "node:perf_hooks";

const PATH = "/keel.v1.IngressService/SubmitMessage";
const FOUR_MIB = 4 * 1024 * 1024;
const TOKEN_CONNECTIONS = 8;
const TICK_MS = 10;
/** Uploads each attacking connection keeps in flight at once. */
const UPLOADS_PER_CONNECTION = 8;

interface Counts {
  uploadsSent: number;
  uploadsRefused: number;
  /** Refused by a stream reset instead (e.g. ENHANCE_YOUR_CALM once the connection's memory budget is spent). */
  uploadsReset: number;
  tokenCallsSent: number;
  tokenCallsRefused: number;
  tokenCallsOther: number;
  errors: number;
}

function connect(url: string): http2.ClientHttp2Session {
  const session = http2.connect(url);
  session.on("error", () => {});
  return session;
}

/** One 4 MiB upload without a token; resolves when the server has answered and the stream ended. */
function upload(session: http2.ClientHttp2Session, body: Buffer, counts: Counts): Promise<void> {
  return new Promise((resolve) => {
    let stream: http2.ClientHttp2Stream;
    try {
      stream = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
    } catch {
      counts.errors++;
      resolve();
      return;
    }
    counts.uploadsSent++;
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
      if (!answered && stream.rstCode !== undefined && stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR && stream.rstCode !== http2.constants.NGHTTP2_CANCEL) counts.uploadsReset++;
      resolve();
    });
    stream.resume();
    stream.write(body);
    stream.end();
  });
}

async function uploads(url: string, until: number, lanes: number, counts: Counts): Promise<void> {
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(FOUR_MIB, 1);
  const body = Buffer.concat([prefix, Buffer.alloc(FOUR_MIB, 0x61)]);
  await Promise.all(
    Array.from({ length: lanes }, async () => {
      let session = connect(url);
      const inFlight = async () => {
        while (performance.now() < until) {
          if (session.closed || session.destroyed) session = connect(url);
          await upload(session, body, counts);
        }
      };
      await Promise.all(Array.from({ length: UPLOADS_PER_CONNECTION }, inFlight));
      session.destroy();
    }),
  );
}

function tokenCall(session: http2.ClientHttp2Session, counts: Counts): void {
  let stream: http2.ClientHttp2Stream;
  try {
    stream = session.request({
      ":method": "POST",
      ":path": PATH,
      "content-type": "application/grpc",
      te: "trailers",
      authorization: `Bearer keel_${randomBytes(24).toString("base64url")}`,
    });
  } catch {
    counts.errors++;
    return;
  }
  counts.tokenCallsSent++;
  let answered = false;
  const settle = (status: unknown) => {
    if (answered) return;
    answered = true;
    if (status === "16") counts.tokenCallsRefused++;
    else counts.tokenCallsOther++;
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

async function tokens(url: string, until: number, rate: number, counts: Counts): Promise<void> {
  const sessions = Array.from({ length: TOKEN_CONNECTIONS }, () => connect(url));
  const started = performance.now();
  let sent = 0;
  let next = 0;
  while (performance.now() < until) {
    // Paced by the clock, not by answers: the attacker does not wait for the server.
    const due = Math.floor(((performance.now() - started) / 1000) * rate);
    for (; sent < due; sent++) {
      let session = sessions[next % sessions.length]!;
      if (session.closed || session.destroyed) sessions[next % sessions.length] = session = connect(url);
      next++;
      tokenCall(session, counts);
    }
    await new Promise((resolve) => setTimeout(resolve, TICK_MS));
  }
  await new Promise((resolve) => setTimeout(resolve, 500));
  for (const session of sessions) session.destroy();
}

async function main(): Promise<void> {
  const [url, mode, seconds, rate, lanes] = process.argv.slice(2);
  if (url === undefined || (mode !== "uploads" && mode !== "tokens" && mode !== "both")) throw new Error("usage: abuse-flood.ts URL uploads|tokens|both SECONDS RATE UPLOADERS");
  const counts: Counts = { uploadsSent: 0, uploadsRefused: 0, uploadsReset: 0, tokenCallsSent: 0, tokenCallsRefused: 0, tokenCallsOther: 0, errors: 0 };
  const until = performance.now() + Number(seconds) * 1000;
  await Promise.all([
    mode === "tokens" ? undefined : uploads(url, until, Number(lanes), counts),
    mode === "uploads" ? undefined : tokens(url, until, Number(rate), counts),
  ]);
  process.stdout.write(`${JSON.stringify(counts)}\n`);
}

await main();
