// A worker whose lease is taken over mid-tool stops at once: its renewal finds the lease gone and
// aborts the claim's signal (the tool sees it within a renewal interval, under 1 s here), and from
// the takeover on, the tool's observations are refused by the fence instead of landing in the
// ledger beside the new holder's.
import { z } from "zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { LeaseLostError } from "../control-plane/src/domain/errors.js";
import { scriptedAgent, scriptedTurn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

/** A promise and the function that resolves it: a latch a test can wait on. */
function latch(): { promise: Promise<void>; open: () => void } {
  let open = (): void => {};
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

/** What the watched tool saw: when it started, when its signal aborted, and observations refused. */
const started = latch();
const aborted = latch();
const seen = { abortedAt: 0, refused: 0, invocationId: "" };

const watchTool = defineTool<Record<string, never>>({
  name: "test.watch",
  version: 1,
  description: "Streams a line every 50 ms until its call is aborted (a write: it stands for an exec).",
  parameters: z.object({}),
  effect: "write",
  async execute(_args, context) {
    seen.invocationId = context.invocationId;
    started.open();
    while (!context.signal.aborted) {
      try {
        await context.observe("stdout", "still working\n");
      } catch (error) {
        if (error instanceof LeaseLostError) seen.refused += 1;
        else throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    seen.abortedAt = Date.now();
    aborted.open();
    throw context.signal.reason;
  },
});

const AGENT = scriptedAgent("lease-loss", [scriptedTurn("", [toolCall("test.watch.v1", {})]), scriptedTurn("done")], { tools: toolGrants(["test.watch.v1"]) });

let keel: TestKeel;
let db: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ workers: 1, agents: [AGENT], tools: [watchTool], env: { KEEL_LEASE_MS: "1500" } });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
}, 60_000);

afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

const observationCount = async (): Promise<number> =>
  Number((await db.query<{ n: string }>("SELECT count(*) AS n FROM observations WHERE tool_invocation_id = $1", [seen.invocationId])).rows[0]?.n ?? 0);

describe("a worker whose lease is taken over mid-call", () => {
  it("aborts the call within 1 s, and no observation of it lands after the takeover", async () => {
    const { runId } = await connectClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
      agentId: AGENT.id,
      conversationId: "lease-loss",
      actor: { id: "tester" },
      messageId: "lease-loss-1",
      text: "watch this",
      connector: "test",
    });
    await started.promise;
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await observationCount()).toBeGreaterThan(0);

    // Another worker takes the run, as a reclaim after an expired lease would.
    await db.query(
      "UPDATE runs SET lease_owner = 'another-worker', lease_epoch = lease_epoch + 1, lease_expires_at = now() + interval '1 hour' WHERE id = $1",
      [runId],
    );
    const stolenAt = Date.now();
    // An insert already under way when the takeover committed may still land; none after it.
    await new Promise((resolve) => setTimeout(resolve, 100));
    const atTakeover = await observationCount();

    await aborted.promise;
    expect(seen.abortedAt - stolenAt).toBeLessThan(1_000);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await observationCount()).toBe(atTakeover);
    expect(seen.refused).toBeGreaterThan(0);
  }, 30_000);
});
