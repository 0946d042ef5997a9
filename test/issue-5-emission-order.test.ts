// Issue #5: emission writers hold the emission-order lock shared, so they no longer queue
// behind each other's commit. A Subscribe cursor must still never skip a row committed late:
// a reader may not return a seq while a smaller one is drawn but not yet committed.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EmissionDraft } from "../control-plane/src/domain/records.js";
import { createEmissionRepository } from "../control-plane/src/ledger/emission.repository.js";
import { reserveEmissions, type EmissionTarget } from "../control-plane/src/ledger/ledger-writes.js";
import { sql as sqlText } from "../control-plane/src/ledger/sql.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

let keel: TestKeel;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
  // The emissions belong to a real run and conversation: the ledger's foreign keys reject orphans.
  await keel.app.ledger.sql.query(sqlText`
    WITH actor AS (INSERT INTO actors (id) VALUES ('issue-5') ON CONFLICT DO NOTHING),
    conversation AS (
      INSERT INTO conversations (id, agent_id, external_id, connector)
      VALUES (${target.conversationId}, ${target.agentId}, ${target.externalConversationId}, ${connector}))
    INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage)
    VALUES (${target.runId}, ${target.agentId}, ${target.conversationId}, ${connector}, 'succeeded', 'issue-5', '{}', '{}')`);
});

afterAll(async () => {
  await keel?.stop();
});

const connector = `order-${randomUUID().slice(0, 8)}`;
const target: EmissionTarget = {
  runId: randomUUID(),
  agentId: "demo",
  conversationId: randomUUID(),
  externalConversationId: "issue-5",
  connector,
};
const draft = (key: string): EmissionDraft => ({ kind: "progress", idempotencyKey: `${connector}:${key}`, text: key, addressedActorIds: [] });

describe("issue #5: emission order without a writers' convoy", () => {
  it("lets a second writer commit while the first is open, and shows neither to a reader until both seqs are settled", async () => {
    const sql = keel.app.ledger.sql;
    const emissions = createEmissionRepository(sql);

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
    const reading = emissions.listAfter(connector, 0, 10).then((rows) => (read = rows.map((row) => row.text)));
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(read).toBeUndefined();

    finishFirst();
    await first;
    await reading;
    expect(read).toEqual(["first", "second"]);
  });
});
