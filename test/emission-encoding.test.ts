// Subscribe encodes an emission once for all the streams of its connector (api/convert.ts,
// encodedSubscribeResponse): the bytes ride as the response's unknown field 1. Every client, binary
// or JSON, Connect, gRPC or grpc-js loading only the .proto files, must read the same emission the
// ledger holds, field for field.
import { randomUUID } from "node:crypto";
import { equals, toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmissionSchema, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { emissionToProto } from "../control-plane/src/api/convert.js";
import { createEmissionRepository } from "../control-plane/src/ledger/emission.repository.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { connectClient, grpcClient, grpcJsBearer, grpcJsClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedEmissionTarget } from "./support/run-seed.js";

let keel: TestKeel;
const connector = `enc-${randomUUID().slice(0, 8)}`;
let target: EmissionTarget;
const COUNT = 3;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
  target = await seedEmissionTarget(keel.app.ledger.sql, connector, { actor: "enc-actor" });
}, 60_000);

afterAll(async () => {
  await keel?.stop();
});

/** Reads COUNT emissions from a Connect-es client's Subscribe. */
async function takeConnect(client: ReturnType<typeof connectClient<typeof EmissionService>>, signal: AbortSignal): Promise<Emission[]> {
  const got: Emission[] = [];
  for await (const { emission } of client.subscribe({ connector }, { signal, timeoutMs: 30_000 })) {
    if (emission !== undefined) got.push(emission);
    if (got.length === COUNT) break;
  }
  return got;
}

interface GrpcJsEmission {
  id: string;
  seq: string;
  connector: string;
  kind: string;
  text: string;
  idempotency_key: string;
  addressed_actor_ids: string[];
  created_at: { seconds: string; nanos: number } | null;
}

/** Reads COUNT emissions with grpc-js, the service loaded from the .proto files as another language would. */
async function takeGrpcJs(): Promise<GrpcJsEmission[]> {
  const client = await grpcJsClient(keel.url, "emission_service.proto", "EmissionService");
  const call = (client as unknown as { Subscribe(r: unknown, m: grpc.Metadata): grpc.ClientReadableStream<{ emission: GrpcJsEmission }> }).Subscribe(
    { connector },
    grpcJsBearer(keel.tokens.connector),
  );
  const got: GrpcJsEmission[] = [];
  try {
    await new Promise<void>((resolve, reject) => {
      call.on("data", (message: { emission: GrpcJsEmission }) => {
        got.push(message.emission);
        if (got.length === COUNT) resolve();
      });
      call.on("error", reject);
    });
  } finally {
    call.cancel();
    client.close();
  }
  return got;
}

describe("Subscribe's once-encoded emissions", () => {
  it("read the same through Connect binary and JSON, gRPC and grpc-js, and match the ledger", async () => {
    const stop = new AbortController();
    const json = createClient(EmissionService, createConnectTransport({
      baseUrl: keel.url,
      httpVersion: "2",
      useBinaryFormat: false,
      interceptors: [(next) => (request) => (request.header.set("authorization", `Bearer ${keel.tokens.connector}`), next(request))],
    }));
    const readers = {
      binary: takeConnect(connectClient(EmissionService, keel.url, keel.tokens.connector), stop.signal),
      json: takeConnect(json, stop.signal),
      grpc: takeConnect(grpcClient(EmissionService, keel.url, keel.tokens.connector), stop.signal),
    };
    const grpcJs = takeGrpcJs();
    try {
      for (let i = 0; i < COUNT; i++) {
        const text = `héllo ${i} ${"✓".repeat(i * 50)}`;
        await keel.app.ledger.sql.transaction((trx) =>
          reserveEmissions(trx, target, [{ kind: "progress", idempotencyKey: `${connector}:${i}`, text, addressedActorIds: ["enc-actor"] }]),
        );
      }
      const [binary, viaJson, viaGrpc, viaGrpcJs] = await Promise.all([readers.binary, readers.json, readers.grpc, grpcJs]);

      const repository = createEmissionRepository(keel.app.ledger.sql);
      const ledger = await Promise.all(binary.map(async (e) => emissionToProto((await repository.get(e.id))!)));
      expect(binary.map((e) => e.text)).toEqual(ledger.map((e) => e.text));
      for (let i = 0; i < COUNT; i++) {
        const want = ledger[i]!;
        for (const got of [binary[i]!, viaJson[i]!, viaGrpc[i]!]) {
          expect(toJson(EmissionSchema, got)).toEqual(toJson(EmissionSchema, want));
          expect(equals(EmissionSchema, got, want)).toBe(true);
          expect(got.$unknown ?? []).toEqual([]);
        }
        const raw = viaGrpcJs[i]!;
        expect(raw).toMatchObject({
          id: want.id,
          seq: String(want.seq),
          connector,
          kind: "EMISSION_KIND_PROGRESS",
          text: want.text,
          idempotency_key: want.idempotencyKey,
          addressed_actor_ids: ["enc-actor"],
          created_at: { seconds: String(want.createdAt?.seconds), nanos: want.createdAt?.nanos },
        });
      }
    } finally {
      stop.abort();
    }
  });
});
