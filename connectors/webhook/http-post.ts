// One POST, classified by what the peer can have seen. Each attempt opens its own connection (no
// keep-alive pool), so "the connection was never established" proves no byte of the request left us:
// only then is a retry safe. Once connected, any error or timeout leaves the outcome unknown.
import http from "node:http";
import https from "node:https";

export type PostOutcome =
  | { readonly kind: "response"; readonly status: number; readonly requestId: string }
  /** Failed before the connection existed (refused, DNS, unreachable, connect timeout): safe to retry. */
  | { readonly kind: "not-sent"; readonly reason: string }
  /** Failed after the request may have reached the peer (reset, timeout, hang-up): never retried. */
  | { readonly kind: "ambiguous"; readonly reason: string };

export interface PostRequest {
  readonly url: URL;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
  readonly timeoutMs: number;
}

export function post(request: PostRequest): Promise<PostOutcome> {
  const transport = request.url.protocol === "https:" ? https : http;
  return new Promise((resolve) => {
    let connected = false;
    let settled = false;
    const finish = (outcome: PostOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(outcome);
    };
    const failed = (reason: string) => finish(connected ? { kind: "ambiguous", reason } : { kind: "not-sent", reason });
    const req = transport.request(request.url, {
      method: "POST",
      agent: false,
      headers: { "content-type": "application/json", "content-length": String(Buffer.byteLength(request.body)), ...request.headers },
    });
    const timer = setTimeout(() => {
      failed(connected ? `no response within ${request.timeoutMs} ms` : `no connection within ${request.timeoutMs} ms`);
      req.destroy();
    }, request.timeoutMs);
    req.on("socket", (socket) => {
      // TLS: nothing of the request is written before the handshake completes.
      const ready = request.url.protocol === "https:" ? "secureConnect" : "connect";
      if (!socket.connecting && request.url.protocol !== "https:") connected = true;
      else socket.once(ready, () => (connected = true));
    });
    req.on("error", (error: NodeJS.ErrnoException) => failed(error.code ?? error.message));
    req.on("response", (response) => {
      // Drain (bounded by the timeout) so the status is final, then report it.
      response.on("data", () => undefined);
      response.on("error", (error: NodeJS.ErrnoException) => failed(error.code ?? error.message));
      response.on("end", () => {
        const id = response.headers["x-request-id"];
        finish({ kind: "response", status: response.statusCode ?? 0, requestId: typeof id === "string" ? id : "" });
      });
    });
    req.end(request.body);
  });
}
