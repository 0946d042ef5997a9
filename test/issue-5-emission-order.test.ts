// Issue #5: emission writers hold the emission-order lock shared, so they no longer queue
// behind each other's commit. A Subscribe cursor must still never skip a row committed late:
// a reader may not return a seq while a smaller one is drawn but not yet committed.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EmissionDraft } from "../control-plane/src/domain/records.js";
import { createEmissionFeed } from "../control-plane/src/ledger/emission-feed.js";
import { startNotificationHub } from "../control-plane/src/ledger/notification-hub.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { seedEmissionTarget } from "./support/run-seed.js";

let keel: TestKeel;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
  target = await seedEmissionTarget(keel.app.ledger.sql, connector, { actor: "issue-5" });
});

afterAll(async () => {
  await keel?.stop();
});

const connector = `order-${randomUUID().slice(0, 8)}`;
let target: EmissionTarget;
const draft = (key: string): EmissionDraft => ({ kind: "progress", idempotencyKey: `${connector}:${key}`, text: key, addressedActorIds: [] });

describe("issue #5: emission order without a writers' convoy", () => {
  it("lets a second writer commit while the first is open, and shows neither to a reader until both seqs are settled", async () => {
    const sql = keel.app.ledger.sql;
    const hub = await startNotificationHub(keel.databaseUrl, () => {});
    const feed = createEmissionFeed(sql, hub, { pollMs: 60_000 });
    const following = new AbortController();

    let finishFirst!: () => void;
    const firstMayCommit = new Promise<void>((resolve) => (finishFirst = resolve));
    let firstReserved!: () => void;
    const firstHasSeq = new Promise<void>((resolve) => (firstReserved = resolve));
    const first = sql.transaction(async (trx) => {
      await reserveEmissions(trx, target, [draft("first")]);
      firstReserved();
      await firstMayCommit;
    });
    await firstHasSeq;

    // The second writer draws a larger seq and commits while the first is still open.
    await sql.transaction((trx) => reserveEmissions(trx, target, [draft("second")]));

    // A reader now must not hand out "second" (a cursor past it would skip "first").
    let read: string[] | undefined;
    const reading = (async () => {
      const texts: string[] = [];
      for await (const row of feed.follow(connector, 0, following.signal)) {
        texts.push(row.text);
        if (texts.length === 2) break;
      }
      read = texts;
    })();
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(read).toBeUndefined();

    finishFirst();
    await first;
    await reading;
    feed.close();
    following.abort();
    await hub.close();
    expect(read).toEqual(["first", "second"]);
  });
});
