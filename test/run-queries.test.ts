// The operator read side (ledger/run-query.repository.ts) through the public API, over ledgers
// written row by row so every case is exact: ListRuns pages keyed to the microsecond, and the
// wait reason and queue position rendered from the run-start rule. test/ledger-statements.test.ts
// prepares the read side's statements against the schema.
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WaitReason } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { connectClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

interface RunSeed {
  readonly id: string;
  readonly status: string;
  /** PostgreSQL timestamptz text, to the microsecond. */
  readonly createdAt: string;
  readonly startedAt?: string;
  readonly notBefore?: string;
}

const uuid = (group: number, n: number) => `00000000-0000-4000-${String(8000 + group)}-${String(n).padStart(12, "0")}`;

describe("operator reads of runs", () => {
  let keel: TestKeel;
  let db: pg.Client;
  let runs: Client<typeof RunService>;

  /** A conversation of the demo agent with the given runs, written straight into the ledger. */
  const seedConversation = async (group: number, externalId: string, seeds: readonly RunSeed[]): Promise<void> => {
    const conversationId = uuid(group, 0);
    await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [
      conversationId,
      DEMO_AGENT.id,
      externalId,
    ]);
    for (const run of seeds) {
      await db.query(
        `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage,
           started_at, not_before, created_at)
         VALUES ($1, $2, $3, 'test', $4, 'someone', '{}', '{}', $5, coalesce($6::timestamptz, $7::timestamptz), $7)`,
        [run.id, DEMO_AGENT.id, conversationId, run.status, run.startedAt ?? null, run.notBefore ?? null, run.createdAt],
      );
    }
  };

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 0 });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    runs = connectClient(RunService, keel.url, keel.tokens.operator);
  });

  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });

  it("pages through runs created in the same millisecond once each, newest first", async () => {
    // Nine runs in one millisecond: distinct microseconds, and two pairs sharing one exactly (ordered by id).
    const micros = [123_001, 123_007, 123_002, 123_005, 123_005, 123_003, 123_009, 123_009, 123_004];
    const seeds = micros.map((us, i) => ({
      id: uuid(1, 10 - i),
      status: "succeeded",
      createdAt: `2026-12-01 12:00:00.${String(us).padStart(6, "0")}+00`,
    }));
    await seedConversation(1, "same-millisecond", seeds);
    const expected = [...seeds]
      .sort((a, b) => (a.createdAt === b.createdAt ? (a.id < b.id ? 1 : -1) : a.createdAt < b.createdAt ? 1 : -1))
      .map((s) => s.id);

    const seen: string[] = [];
    let pageToken = "";
    let pages = 0;
    do {
      const page = await runs.listRuns({ conversationId: "same-millisecond", pageSize: 2, pageToken });
      seen.push(...page.runs.map((r) => r.id));
      pageToken = page.nextPageToken;
      pages++;
    } while (pageToken !== "" && pages < 20);

    expect(seen).toEqual(expected);
    expect(pages).toBe(5);
  });

  it("refuses a page token of the old millisecond form, or any it did not issue, as InvalidArgument on page_token", async () => {
    const tokens = [
      `2026-12-01T12:00:00.123Z|${uuid(1, 1)}`,
      `2026-02-31T12:00:00.123000Z|${uuid(1, 1)}`,
      `2026-12-01T12:00:00.123000Z|not-a-uuid`,
    ].map((key) => Buffer.from(key, "utf8").toString("base64url"));
    for (const pageToken of tokens) {
      const refused = await runs.listRuns({ pageSize: 2, pageToken }).then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
      expect(refused?.code, pageToken).toBe(Code.InvalidArgument);
      expect(refused?.rawMessage).toMatch(/^page_token: /);
    }
  });

  it("reads a queued run's wait reason and queue position from the run-start rule as it is now", async () => {
    const inFlight = uuid(2, 1);
    const behind = uuid(2, 2);
    const furtherBehind = uuid(2, 3);
    const coalescing = uuid(3, 1);
    const settled = uuid(4, 1);
    await seedConversation(2, "busy", [
      { id: inFlight, status: "running", createdAt: "2026-12-01 12:00:01+00", startedAt: "2026-12-01 12:00:01+00" },
      { id: behind, status: "queued", createdAt: "2026-12-01 12:00:02+00" },
      { id: furtherBehind, status: "queued", createdAt: "2026-12-01 12:00:03+00" },
    ]);
    await seedConversation(3, "coalescing", [{ id: coalescing, status: "queued", createdAt: "2026-12-01 12:00:04+00", notBefore: "2999-01-01 00:00:00+00" }]);
    await seedConversation(4, "settled", [{ id: settled, status: "succeeded", createdAt: "2026-12-01 12:00:05+00" }]);

    const read = async (runId: string) => {
      const { run } = await runs.getRun({ runId });
      return { waitReason: run?.waitReason, queuePosition: run?.queuePosition };
    };
    expect(await read(inFlight)).toEqual({ waitReason: WaitReason.UNSPECIFIED, queuePosition: 0 });
    expect(await read(behind)).toEqual({ waitReason: WaitReason.CONVERSATION_BUSY, queuePosition: 1 });
    expect(await read(furtherBehind)).toEqual({ waitReason: WaitReason.CONVERSATION_BUSY, queuePosition: 2 });
    // Not held by its conversation: its place is among its agent's queued root runs, after the two above.
    expect(await read(coalescing)).toEqual({ waitReason: WaitReason.COALESCING, queuePosition: 3 });
    expect(await read(settled)).toEqual({ waitReason: WaitReason.UNSPECIFIED, queuePosition: 0 });

    // ListRuns shows the same view as GetRun.
    const listed = await runs.listRuns({ conversationId: "busy", pageSize: 10 });
    expect(listed.runs.map((r) => [r.id, r.waitReason, r.queuePosition])).toEqual([
      [furtherBehind, WaitReason.CONVERSATION_BUSY, 2],
      [behind, WaitReason.CONVERSATION_BUSY, 1],
      [inFlight, WaitReason.UNSPECIFIED, 0],
    ]);
  });
});
