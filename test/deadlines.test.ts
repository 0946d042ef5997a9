// Unary calls are bounded by the server's default deadline even when the client sets none. A call
// that runs past it gets DeadlineExceeded; the server keeps serving; and because admission is
// idempotent on the message id, the connector's retry finds what the late call stored.
import { Code, ConnectError } from "@connectrpc/connect";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { grpcClient } from "./support/clients.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const DEADLINE_MS = 300;

describe("the default deadline", () => {
  let keel: TestKeel;
  let db: pg.Client;

  beforeAll(async () => {
    keel = await startTestKeel({ env: { KEEL_DEFAULT_DEADLINE_MS: String(DEADLINE_MS) } });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
  }, 60_000);

  afterAll(async () => {
    await db?.end();
    await keel?.stop();
  });

  it("ends a call stuck past it with DeadlineExceeded, keeps serving, and the retry finds the message", async () => {
    const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
    const message = (conversationId: string, messageId: string) => ({
      agentId: DEMO_AGENT.id,
      conversationId,
      actor: { id: "ana" },
      messageId,
      text: `hello from ${messageId}`,
      connector: "test",
    });
    await ingress.submitMessage(message("held", "m1"));

    // Another session holds the conversation's row lock, so the next admission there waits.
    await db.query("BEGIN");
    await db.query("SELECT id FROM conversations WHERE external_id = 'held' FOR UPDATE");
    const started = Date.now();
    const stuck = await ingress.submitMessage(message("held", "m2")).then(
      () => undefined,
      (error: unknown) => ConnectError.from(error),
    );
    const waited = Date.now() - started;
    expect(stuck?.code).toBe(Code.DeadlineExceeded);
    expect(waited).toBeGreaterThanOrEqual(DEADLINE_MS - 50);
    expect(waited).toBeLessThan(DEADLINE_MS + 2_000);

    // The server keeps answering other conversations meanwhile.
    const other = await ingress.submitMessage(message("free", "m3"));
    expect(other.duplicate).toBe(false);

    // Once the lock goes, the late admission completes; the connector's retry is a duplicate of it.
    await db.query("ROLLBACK");
    await expect
      .poll(async () => (await db.query("SELECT run_id FROM messages WHERE external_id = 'm2' AND run_id IS NOT NULL")).rowCount, { timeout: 10_000 })
      .toBe(1);
    const retried = await ingress.submitMessage(message("held", "m2"));
    expect(retried.duplicate).toBe(true);
    const { rows } = await db.query<{ run_id: string }>("SELECT run_id FROM messages WHERE external_id = 'm2'");
    expect(retried.runId).toBe(rows[0]?.run_id);
  }, 60_000);
});
