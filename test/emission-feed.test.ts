// One emission reader per process (ledger/emission-feed.ts): every stream gets every emission of
// its connector once and in order, whether it starts at the tail, far behind, or falls behind
// while reading; and a token cannot open more Subscribe streams than its cap.
import { randomUUID } from "node:crypto";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import type { EmissionDraft } from "../control-plane/src/domain/records.js";
import { createEmissionFeed, type EmissionFeed } from "../control-plane/src/ledger/emission-feed.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { startNotificationHub, type NotificationHub } from "../control-plane/src/ledger/notification-hub.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedEmissionTarget } from "./support/run-seed.js";

let keel: TestKeel;
let hub: NotificationHub;
const connector = `feed-${randomUUID().slice(0, 8)}`;
let target: EmissionTarget;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0, env: { KEEL_MAX_STREAMS_PER_TOKEN: "3" } });
  target = await seedEmissionTarget(keel.app.ledger.sql, connector, { actor: "feed" });
  hub = await startNotificationHub(keel.databaseUrl, () => {});
}, 60_000);

afterAll(async () => {
  await hub?.close();
  await keel?.stop();
});

let written = 0;
/** Commits `count` emissions for the connector, one transaction each; returns their texts. */
async function emit(count: number): Promise<string[]> {
  const texts: string[] = [];
  for (let i = 0; i < count; i++) {
    const text = `e${written++}`;
    const draft: EmissionDraft = { kind: "progress", idempotencyKey: `${connector}:${text}`, text, addressedActorIds: [] };
    await keel.app.ledger.sql.transaction((trx) => reserveEmissions(trx, target, [draft]));
    texts.push(text);
  }
  return texts;
}

/** Reads `count` texts from a follow, optionally slowly; the signal ends it after. */
async function take(feed: EmissionFeed, afterSeq: number, count: number, slowMs = 0): Promise<string[]> {
  const stop = new AbortController();
  const texts: string[] = [];
  const timer = setTimeout(() => stop.abort(), 30_000);
  try {
    for await (const row of feed.follow(connector, afterSeq, stop.signal)) {
      texts.push(row.text);
      if (slowMs > 0) await new Promise((resolve) => setTimeout(resolve, slowMs));
      if (texts.length === count) break;
    }
  } finally {
    clearTimeout(timer);
    stop.abort();
  }
  return texts;
}

describe("the emission feed", () => {
  it("gives 200 streams at the tail and streams starting behind each emission once, in order", async () => {
    const feed = createEmissionFeed(keel.app.ledger.sql, hub, { pollMs: 5_000, batch: 7 });
    try {
      const before = await emit(10);
      const tails = Array.from({ length: 200 }, () => take(feed, 0, 40));
      const late = take(feed, 0, 40);
      const after = await emit(30);
      const everything = [...before, ...after];
      for (const texts of await Promise.all([...tails, late])) expect(texts).toEqual(everything);
    } finally {
      feed.close();
    }
  }, 60_000);

  it("lets a stream too slow for its deliveries fall back to reading, losing nothing", async () => {
    const feed = createEmissionFeed(keel.app.ledger.sql, hub, { pollMs: 5_000, maxQueued: 3 });
    try {
      const first = written;
      const slow = take(feed, 0, first + 25, 20);
      const expected = [...Array.from({ length: first }, (_, i) => `e${i}`), ...(await emit(25))];
      expect(await slow).toEqual(expected);
    } finally {
      feed.close();
    }
  }, 60_000);
});

describe("Subscribe streams per token", () => {
  it("refuses a stream beyond the token's cap with ResourceExhausted, and frees a slot when one ends", async () => {
    const client = connectClient(EmissionService, keel.url, keel.tokens.connector);
    const streams = Array.from({ length: 3 }, () => new AbortController());
    const open = streams.map(async (stop) => {
      try {
        for await (const message of client.subscribe({ connector }, { signal: stop.signal })) void message;
      } catch {
        // ended by the test
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 500));
    const refused = await (async () => {
      try {
        for await (const message of client.subscribe({ connector }, { timeoutMs: 5_000 })) void message;
        return undefined;
      } catch (error) {
        return ConnectError.from(error);
      }
    })();
    expect(refused?.code).toBe(Code.ResourceExhausted);
    expect(refused?.rawMessage).toMatch(/Subscribe streams/);

    streams[0]?.abort();
    await new Promise((resolve) => setTimeout(resolve, 500));
    const again = new AbortController();
    const iterator = client.subscribe({ connector }, { signal: again.signal })[Symbol.asyncIterator]();
    const first = await iterator.next();
    expect(first.done).toBe(false);
    again.abort();
    for (const stop of streams) stop.abort();
    await Promise.all(open);
  }, 30_000);
});
