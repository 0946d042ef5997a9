// Subscribe writes binary calls' emissions as frames straight to the HTTP/2 stream, behind the
// headers connect sends (api/direct-frames.ts), while JSON calls and HTTP/1.1 go through connect.
// Whatever the path, every client must read every emission once, in order, through bursts, a
// client that stops reading for a while, and the end of the stream with its status.
import { randomUUID } from "node:crypto";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import type { EmissionDraft } from "../control-plane/src/domain/records.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { sql as sqlText } from "../control-plane/src/ledger/sql.js";
import { grpcJsBearer, grpcJsClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedEmissionTarget } from "./support/run-seed.js";

let keel: TestKeel;
const connector = `frames-${randomUUID().slice(0, 8)}`;
let target: EmissionTarget;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
  target = await seedEmissionTarget(keel.app.ledger.sql, connector, { actor: "frames-actor" });
}, 60_000);

afterAll(async () => {
  await keel?.stop();
});

let written = 0;
/** Commits `batches` transactions of `perBatch` emissions each, as fast as they go; returns the texts. */
async function emit(batches: number, perBatch: number, pad = 0): Promise<string[]> {
  const texts: string[] = [];
  for (let b = 0; b < batches; b++) {
    const drafts: EmissionDraft[] = Array.from({ length: perBatch }, () => {
      const text = `f${written++} ${"x".repeat(pad)}`;
      texts.push(text);
      return { kind: "progress", idempotencyKey: `${connector}:${text.slice(0, 16)}:${randomUUID()}`, text, addressedActorIds: [] };
    });
    await keel.app.ledger.sql.transaction((trx) => reserveEmissions(trx, target, drafts));
  }
  return texts;
}

async function lastSeq(): Promise<bigint> {
  const [row] = await keel.app.ledger.sql.query<{ seq: string }>(sqlText`SELECT coalesce(max(seq), 0)::text AS seq FROM emissions`);
  return BigInt(row?.seq ?? 0);
}

const bearer = (token: string) => [
  (next: Parameters<import("@connectrpc/connect").Interceptor>[0]) => (request: Parameters<typeof next>[0]) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  },
];

/** Every kind of client connect-node has, on both listeners, binary and JSON. */
function clients(token: string): Record<string, Client<typeof EmissionService>> {
  const interceptors = bearer(token);
  return {
    "connect binary": createClient(EmissionService, createConnectTransport({ baseUrl: keel.url, httpVersion: "2", interceptors })),
    "connect JSON": createClient(EmissionService, createConnectTransport({ baseUrl: keel.url, httpVersion: "2", useBinaryFormat: false, interceptors })),
    "connect binary, HTTP/1.1": createClient(EmissionService, createConnectTransport({ baseUrl: keel.http1Url, httpVersion: "1.1", interceptors })),
    gRPC: createClient(EmissionService, createGrpcTransport({ baseUrl: keel.url, interceptors })),
    "gRPC-Web binary": createClient(EmissionService, createGrpcWebTransport({ baseUrl: keel.url, httpVersion: "2", interceptors })),
    "gRPC-Web binary, HTTP/1.1": createClient(EmissionService, createGrpcWebTransport({ baseUrl: keel.http1Url, httpVersion: "1.1", interceptors })),
  };
}

/** Reads into `texts` until `count` arrived (then stops) or the stream ends; `pauseMs` after the first. */
async function read(
  client: Client<typeof EmissionService>,
  afterSeq: bigint,
  count: number,
  signal: AbortSignal,
  { pauseMs = 0, texts = [] as string[] } = {},
): Promise<{ texts: string[]; error?: ConnectError }> {
  try {
    for await (const { emission } of client.subscribe({ connector, afterSeq }, { signal, timeoutMs: 60_000 })) {
      if (emission !== undefined) texts.push(emission.text);
      if (texts.length === 1 && pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs));
      if (texts.length === count) break;
    }
    return { texts };
  } catch (error) {
    return { texts, error: ConnectError.from(error) };
  }
}

/** The same with grpc-js, the service loaded from the .proto files as another language would. */
async function readGrpcJs(token: string, afterSeq: bigint, count: number, texts: string[] = []): Promise<{ texts: string[]; code?: number }> {
  const client = await grpcJsClient(keel.url, "emission_service.proto", "EmissionService");
  const call = (client as unknown as { Subscribe(r: unknown, m: grpc.Metadata): grpc.ClientReadableStream<{ emission: { text: string } }> }).Subscribe(
    { connector, after_seq: String(afterSeq) },
    grpcJsBearer(token),
  );
  try {
    return await new Promise((resolve) => {
      const timer = setTimeout(() => resolve({ texts, code: -1 }), 60_000);
      call.on("data", ({ emission }: { emission: { text: string } }) => {
        texts.push(emission.text);
        if (texts.length !== count) return;
        clearTimeout(timer);
        resolve({ texts });
      });
      call.on("error", (error: grpc.ServiceError) => {
        clearTimeout(timer);
        resolve({ texts, code: error.code });
      });
    });
  } finally {
    call.cancel();
    client.close();
  }
}

describe("Subscribe's frames", () => {
  it("reach every client, binary or JSON, HTTP/2 or 1.1, once and in order through bursts", async () => {
    const from = await lastSeq();
    const expected = await emit(3, 20);
    const stop = new AbortController();
    const total = expected.length + 400;
    const readers = Object.entries(clients(keel.tokens.connector)).map(async ([name, client]) => [name, await read(client, from, total, stop.signal)] as const);
    const grpcJs = readGrpcJs(keel.tokens.connector, from, total);
    try {
      // Bursts of 40 emissions a transaction while the streams catch up and then follow the tail.
      expected.push(...(await emit(10, 40)));
      for (const [name, result] of await Promise.all(readers)) {
        expect(result.error, name).toBeUndefined();
        expect(result.texts, name).toEqual(expected);
      }
      expect((await grpcJs).texts).toEqual(expected);
    } finally {
      stop.abort();
    }
  });

  it("wait for a client that stops reading, sending the rest once it reads again", async () => {
    const from = await lastSeq();
    const stop = new AbortController();
    const client = clients(keel.tokens.connector)["gRPC"]!;
    // 400 emissions of 4 KiB: far more than HTTP/2's windows and the 1 MiB a stream may hold unsent.
    const reading = read(client, from, 400, stop.signal, { pauseMs: 1_500 });
    try {
      const expected = await emit(20, 20, 4096);
      const result = await reading;
      expect(result.error).toBeUndefined();
      expect(result.texts).toEqual(expected);
    } finally {
      stop.abort();
    }
  });

  it("end with the call's status after frames went out: a revoked token's streams end Unauthenticated", async () => {
    const { id, secret } = await keel.app.tokens.create("connector", "frames-doomed", { scope: { kind: "connector", connectors: [connector], agents: "any" } });
    const from = await lastSeq();
    const stop = new AbortController();
    const seen = Array.from({ length: 7 }, () => [] as string[]);
    const readers = Object.entries(clients(secret)).map(async ([name, client], i) => [name, await read(client, from, 1_000, stop.signal, { texts: seen[i]! })] as const);
    const grpcJs = readGrpcJs(secret, from, 1_000, seen[6]);
    try {
      const expected = await emit(2, 5);
      // Every stream has had its frames before the revocation, so its status comes after them.
      await expect.poll(() => seen.every((texts) => texts.length === expected.length), { timeout: 30_000 }).toBe(true);
      expect(await keel.app.tokens.revoke(id)).toBe(true);
      for (const [name, result] of await Promise.all(readers)) {
        expect(result.texts, name).toEqual(expected);
        expect(result.error?.code, name).toBe(Code.Unauthenticated);
      }
      const viaGrpcJs = await grpcJs;
      expect(viaGrpcJs.texts).toEqual(expected);
      expect(viaGrpcJs.code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      stop.abort();
    }
  });
});
