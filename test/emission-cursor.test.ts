// Subscribe's cursor over the wire, with grpc-js loading only the .proto files as another language's
// connector would. A connector that drops its stream at arbitrary points while emissions keep
// committing, and reconnects with the last seq it saw, receives every emission of its connector
// exactly once and in order. One that rewinds its cursor is offered its settled emissions again
// marked as settled: the AMBIGUOUS ones carry AMBIGUOUS (so a connector delivering only PENDING
// ones sends nothing twice), and no later acknowledgement can reopen them.
import { randomUUID } from "node:crypto";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EmissionDraft } from "../control-plane/src/domain/records.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { sql as sqlText } from "../control-plane/src/ledger/sql.js";
import { grpcJsBearer, grpcJsClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedEmissionTarget } from "./support/run-seed.js";

let keel: TestKeel;
const connector = `cursor-${randomUUID().slice(0, 8)}`;
let target: EmissionTarget;

interface WireEmission {
  id: string;
  seq: string;
  kind: string;
  text: string;
  idempotency_key: string;
  delivery_status: string;
}

interface EmissionStub extends grpc.Client {
  Subscribe(request: { connector: string; after_seq: string }, metadata: grpc.Metadata): grpc.ClientReadableStream<{ emission: WireEmission }>;
  AcknowledgeEmission(
    request: { emission_id: string; outcome: string; detail?: string },
    metadata: grpc.Metadata,
    callback: (error: grpc.ServiceError | null, response?: { emission: WireEmission }) => void,
  ): grpc.ClientUnaryCall;
}

let stub: EmissionStub;
const metadata = () => grpcJsBearer(keel.tokens.connector);

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
  target = await seedEmissionTarget(keel.app.ledger.sql, connector, { actor: "cursor-actor", status: "running" });
  stub = (await grpcJsClient(keel.url, "emission_service.proto", "EmissionService")) as unknown as EmissionStub;
}, 60_000);

afterAll(async () => {
  stub?.close();
  await keel?.stop();
});

let written = 0;
/** Commits `count` progress emissions, `perCommit` to a transaction. */
async function emit(count: number, perCommit: number): Promise<void> {
  for (let i = 0; i < count; i += perCommit) {
    const drafts: EmissionDraft[] = [];
    for (let j = 0; j < perCommit && i + j < count; j++) {
      const text = `n${written++}`;
      drafts.push({ kind: "progress", idempotencyKey: `progress:${connector}:${text}`, text, addressedActorIds: [] });
    }
    await keel.app.ledger.sql.transaction((trx) => reserveEmissions(trx, target, drafts));
  }
}

/** Reads `count` emissions from after `afterSeq`, then cancels the stream (the connector drops it). */
function take(afterSeq: string, count: number): Promise<WireEmission[]> {
  return new Promise((resolve, reject) => {
    const got: WireEmission[] = [];
    const call = stub.Subscribe({ connector, after_seq: afterSeq }, metadata());
    const timer = setTimeout(() => (call.cancel(), reject(new Error(`only ${got.length} of ${count} emissions within 30 s`))), 30_000);
    call.on("data", ({ emission }: { emission: WireEmission }) => {
      if (got.length === count) return;
      got.push(emission);
      if (got.length === count) {
        clearTimeout(timer);
        call.cancel();
        resolve(got);
      }
    });
    call.on("error", (error: grpc.ServiceError) => {
      if (error.code === grpc.status.CANCELLED) return;
      clearTimeout(timer);
      reject(error);
    });
  });
}

function acknowledge(id: string, outcome: "DELIVERY_STATUS_DELIVERED" | "DELIVERY_STATUS_AMBIGUOUS" | "DELIVERY_STATUS_FAILED"): Promise<WireEmission> {
  return new Promise((resolve, reject) =>
    stub.AcknowledgeEmission({ emission_id: id, outcome }, metadata(), (error, response) => (error ? reject(error) : resolve(response?.emission as WireEmission))),
  );
}

/** What the ledger holds for the connector, in stream order. */
async function ledgerTexts(): Promise<string[]> {
  const rows = await keel.app.ledger.sql.query<{ text: string }>(sqlText`SELECT text FROM emissions WHERE connector = ${connector} ORDER BY seq`);
  return rows.map((row) => row.text);
}

const TOTAL = 150;
/** Where the connector drops its stream: before, inside and after commits of several emissions. */
const CUTS = [1, 7, 2, 13, 5, 3, 11, 1, 17, 4, 9, 6, 19, 8, 2, 23, 10, 9];

describe("Subscribe cursors over grpc-js", () => {
  it("a connector that drops and resumes from its cursor while commits continue gets each emission once, in order", async () => {
    await emit(20, 1);
    // Commits keep landing, one and three at a time, while the connector reconnects.
    const writer = (async () => {
      await emit(60, 3);
      await emit(TOTAL - 80, 1);
    })();
    const received: WireEmission[] = [];
    let cursor = "0";
    for (const cut of CUTS) {
      const got = await take(cursor, cut);
      received.push(...got);
      cursor = got.at(-1)?.seq ?? cursor;
      // Acknowledged as a connector would: every fifth one timed out after sending.
      for (const emission of got) await acknowledge(emission.id, Number(emission.seq) % 5 === 0 ? "DELIVERY_STATUS_AMBIGUOUS" : "DELIVERY_STATUS_DELIVERED");
    }
    expect(CUTS.reduce((a, b) => a + b, 0)).toBe(TOTAL);
    await writer;
    const texts = received.map((e) => e.text);
    expect(new Set(received.map((e) => e.id)).size).toBe(TOTAL);
    expect(texts).toEqual(await ledgerTexts());
    expect(texts).toEqual(Array.from({ length: TOTAL }, (_, i) => `n${i}`));
    // Fresh emissions were offered unsettled: nothing arrived already marked.
    expect(received.every((e) => e.delivery_status === "DELIVERY_STATUS_PENDING")).toBe(true);
    expect(received.every((e) => e.kind === "EMISSION_KIND_PROGRESS")).toBe(true);
  }, 120_000);

  it("a rewound connector is offered the AMBIGUOUS ones as AMBIGUOUS and sends nothing again; no ack reopens them", async () => {
    const rewound = await take("0", TOTAL);
    expect(rewound.map((e) => e.text)).toEqual(await ledgerTexts());
    const ambiguous = rewound.filter((e) => Number(e.seq) % 5 === 0);
    expect(ambiguous.length).toBeGreaterThan(0);
    for (const e of rewound) {
      expect(e.delivery_status).toBe(Number(e.seq) % 5 === 0 ? "DELIVERY_STATUS_AMBIGUOUS" : "DELIVERY_STATUS_DELIVERED");
    }
    // The rule every connector follows: deliver PENDING ones only.
    expect(rewound.filter((e) => e.delivery_status === "DELIVERY_STATUS_PENDING")).toEqual([]);

    // A connector that retries, or rewinds and acknowledges again, cannot turn ambiguous into anything else.
    const first = ambiguous[0] as WireEmission;
    expect((await acknowledge(first.id, "DELIVERY_STATUS_DELIVERED")).delivery_status).toBe("DELIVERY_STATUS_AMBIGUOUS");
    expect((await acknowledge(first.id, "DELIVERY_STATUS_FAILED")).delivery_status).toBe("DELIVERY_STATUS_AMBIGUOUS");
    // A rewind to the middle resumes exactly there, settled marks included.
    const middle = rewound[TOTAL / 2 - 1] as WireEmission;
    const tail = await take(middle.seq, TOTAL / 2);
    expect(tail.map((e) => e.id)).toEqual(rewound.slice(TOTAL / 2).map((e) => e.id));
    expect(tail.map((e) => e.delivery_status)).toEqual(rewound.slice(TOTAL / 2).map((e) => e.delivery_status));
  }, 60_000);
});
