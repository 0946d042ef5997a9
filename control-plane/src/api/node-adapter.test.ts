import http from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { Code, ConnectError, createClient, type ConnectRouter } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { Health, HealthCheckResponse_ServingStatus } from "../../../gen/grpc/health/v1/health_pb.js";
import { clientLeft, connectRequestHandler } from "./node-adapter.js";

/** A Watch that answers every 5 ms until its call ends, as a dashboard's WatchRun keeps writing. */
const routes = (router: ConnectRouter) =>
  router.service(Health, {
    check: () => ({ status: HealthCheckResponse_ServingStatus.SERVING }),
    async *watch(_request, context) {
      while (!context.signal.aborted) {
        yield { status: HealthCheckResponse_ServingStatus.SERVING };
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    },
  });

let server: http.Server | undefined;
afterEach(async () => {
  const closing = server;
  server = undefined;
  if (closing !== undefined) {
    closing.closeAllConnections();
    await new Promise((resolve) => closing.close(resolve));
  }
  vi.restoreAllMocks();
});

async function serve(): Promise<{ url: string; lines: Array<{ level: number; msg: string }> }> {
  const lines: Array<{ level: number; msg: string }> = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split("\n").filter(Boolean)) lines.push(JSON.parse(line) as { level: number; msg: string });
      done();
    },
  });
  const log = pino({ level: "debug" }, sink);
  const fallback = (_request: unknown, response: { writeHead(status: number): void; end(): void }) => {
    response.writeHead(404);
    response.end();
  };
  server = http.createServer(connectRequestHandler({ routes, fallback, log }) as http.RequestListener);
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, lines };
}

describe("connect's router on Node's servers", () => {
  it("serves calls and sends unknown paths to the fallback", async () => {
    const { url } = await serve();
    const health = createClient(Health, createConnectTransport({ baseUrl: url, httpVersion: "1.1" }));
    expect((await health.check({})).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect((await fetch(`${url}/nothing/here`)).status).toBe(404);
  });

  it("logs a client that leaves a stream as a JSON debug line, never as plain text on stderr", async () => {
    const printed = vi.spyOn(console, "error");
    const { url, lines } = await serve();
    const health = createClient(Health, createConnectTransport({ baseUrl: url, httpVersion: "1.1" }));
    const leaving = new AbortController();
    let seen = 0;
    await expect(
      (async () => {
        for await (const _ of health.watch({}, { signal: leaving.signal })) if (++seen === 3) leaving.abort();
      })(),
    ).rejects.toThrow();
    await expect.poll(() => lines.some((line) => line.msg === "the client left before its answer was written"), { timeout: 5_000 }).toBe(true);
    expect(lines.filter((line) => line.level >= 50)).toEqual([]);
    expect(printed).not.toHaveBeenCalled();
  });

  it("tells a client that left from a failure on Keel's side", () => {
    const live = { socket: { destroyed: false } } as unknown as http.IncomingMessage;
    const open = { destroyed: false } as unknown as http.ServerResponse;
    const closed = { destroyed: true } as unknown as http.ServerResponse;
    const epipe = new ConnectError("write EPIPE", Code.Internal, undefined, undefined, Object.assign(new Error("write EPIPE"), { code: "EPIPE" }));
    expect(clientLeft(live, open, epipe)).toBe(true);
    expect(clientLeft(live, open, new ConnectError("gone", Code.Canceled))).toBe(true);
    expect(clientLeft(live, closed, new Error("any"))).toBe(true);
    expect(clientLeft(live, open, new Error("a bug"))).toBe(false);
    expect(clientLeft(live, open, new ConnectError("bad", Code.Internal, undefined, undefined, Object.assign(new Error("x"), { code: "ERR_INVALID_ARG_TYPE" })))).toBe(false);
  });
});
