// The external system the chaos workload writes to: a small HTTP service outside the ledger
// that records every effect with its idempotency key (the tool invocation's id). It never
// deduplicates: it counts every attempt, so a key applied twice shows up as a duplicate.
//
// A lookup of a key that was never applied fences that key, as an idempotent service must: a
// late request for it (a frozen worker that wakes up after recovery decided "not applied")
// is refused with 409 and counted, never applied.
import { createServer, type IncomingMessage, type Server } from "node:http";

export interface EffectRecord {
  readonly key: string;
  readonly runId: string;
  readonly at: number;
}

export interface EffectLog {
  readonly url: string;
  /** Every applied request, in arrival order (a repeated key appears twice). */
  readonly records: readonly EffectRecord[];
  /** Requests refused because a lookup had already declared their key not applied. */
  readonly fencedRequests: () => number;
  readonly lookups: () => { applied: number; notApplied: number };
  close(): Promise<void>;
}

const MAX_BODY_BYTES = 4096;
const ANSWER_DELAY_MS = 150;

function readBody(request: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let body = "";
    request.setEncoding("utf8");
    request.on("data", (chunk: string) => {
      body += chunk;
      if (body.length > MAX_BODY_BYTES) request.destroy(new Error("body too large"));
    });
    request.on("end", () => resolve(body));
    request.on("error", reject);
  });
}

export async function startEffectLog(): Promise<EffectLog> {
  const records: EffectRecord[] = [];
  const applied = new Set<string>();
  const fenced = new Set<string>();
  let fencedRequests = 0;
  const lookups = { applied: 0, notApplied: 0 };

  const server: Server = createServer((request, response) => {
    const reply = (status: number, text: string) => {
      response.writeHead(status, { "content-type": "text/plain" });
      response.end(text);
    };
    const url = new URL(request.url ?? "/", "http://effect-log");
    if (request.method === "POST" && url.pathname === "/effects") {
      readBody(request).then(
        (body) => {
          const parsed = JSON.parse(body) as { key?: unknown; runId?: unknown };
          if (typeof parsed.key !== "string" || typeof parsed.runId !== "string") return reply(400, "key and runId are required");
          if (fenced.has(parsed.key)) {
            fencedRequests += 1;
            return reply(409, "a lookup already declared this key not applied");
          }
          records.push({ key: parsed.key, runId: parsed.runId, at: Date.now() });
          applied.add(parsed.key);
          // Applied at once, answered later, as a remote service would: a fault in between
          // leaves a write done whose result its caller never saw.
          setTimeout(() => reply(200, "recorded"), ANSWER_DELAY_MS);
        },
        () => reply(400, "unreadable body"),
      );
      return;
    }
    const key = url.pathname.startsWith("/effects/") ? decodeURIComponent(url.pathname.slice("/effects/".length)) : "";
    if (request.method === "GET" && key !== "") {
      if (applied.has(key)) {
        lookups.applied += 1;
        return reply(200, "applied");
      }
      fenced.add(key);
      lookups.notApplied += 1;
      return reply(404, "not applied");
    }
    reply(404, "no such route");
  });
  // Keep-alive sockets from killed replicas must not hold close() up.
  server.keepAliveTimeout = 1_000;
  const url = await new Promise<string>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      if (typeof address === "object" && address !== null) resolve(`http://127.0.0.1:${address.port}`);
      else reject(new Error("the effect log has no address"));
    });
  });
  return {
    url,
    records,
    fencedRequests: () => fencedRequests,
    lookups: () => ({ ...lookups }),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
