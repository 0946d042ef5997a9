// Issue #12 items 2, 5 and 6: connector tokens act only as their connectors and agents, CancelRun
// honours the agent's interrupt scope, revocation and expiry end calls and open streams, and the
// token cache stays bounded. Real server, real PostgreSQL, Connect and @grpc/grpc-js clients.
import * as grpc from "@grpc/grpc-js";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliveryStatus, EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { createApiTokenRepository, hashToken } from "../control-plane/src/ledger/api-token.repository.js";
import { sql, type Sql } from "../control-plane/src/ledger/sql.js";
import { connectClient, grpcJsBearer, grpcJsClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

// Its runs wait out a long coalesce window, so they are still there to be cancelled.
const STRICT_AGENT = { ...DEMO_AGENT, id: "strict", interrupt: { ...DEMO_AGENT.interrupt, scope: "same_actor_only" as const, coalesceWindowMs: 60_000 } };

let keel: TestKeel;
let slackToken: string;
beforeAll(async () => {
  keel = await startTestKeel({ workers: 1, agents: [DEMO_AGENT, STRICT_AGENT] });
  slackToken = (await keel.app.tokens.create("connector", "slack bot", { scope: { kind: "connector", connectors: ["slack"], agents: ["demo", "strict"] } })).secret;
});
afterAll(async () => {
  await keel.stop();
});

const codeOf = async (call: Promise<unknown>): Promise<Code | "ok"> =>
  call.then(
    () => "ok",
    (error: unknown) => ConnectError.from(error).code,
  );
const actor = (id: string) => ({ id, displayName: id });
const submit = (token: string, connector: string, conversationId: string, agentId = "demo", actorId = "alice") =>
  connectClient(IngressService, keel.url, token).submitMessage({
    agentId,
    conversationId,
    connector,
    actor: actor(actorId),
    messageId: `m-${Math.random().toString(36).slice(2)}`,
    text: "hello",
  });

/** The first emission on a connector, read with the unscoped fixture token. */
async function firstEmission(connector: string, conversation?: string) {
  const done = new AbortController();
  const timer = setTimeout(() => done.abort(), 15_000);
  try {
    for await (const { emission } of connectClient(EmissionService, keel.url, keel.tokens.connector).subscribe({ connector }, { signal: done.signal })) {
      if (emission !== undefined && (conversation === undefined || emission.conversationId === conversation)) return emission;
    }
  } finally {
    clearTimeout(timer);
    done.abort(); // hang up the stream on the server too
  }
  throw new Error("no emission");
}

describe("a connector token", () => {
  it("submits, edits and subscribes only as its own connectors and agents", async () => {
    expect(await codeOf(submit(slackToken, "slack", "c-own"))).toBe("ok");
    expect(await codeOf(submit(slackToken, "discord", "c-other"))).toBe(Code.PermissionDenied);
    expect(await codeOf(submit(slackToken, "slack", "c-agent", "other-agent"))).toBe(Code.PermissionDenied);
    // A conversation another connector opened is not this token's to write into, by any connector name.
    expect(await codeOf(submit(keel.tokens.connector, "discord", "c-discord"))).toBe("ok");
    expect(await codeOf(submit(slackToken, "slack", "c-discord"))).toBe(Code.PermissionDenied);
    const edit = connectClient(IngressService, keel.url, slackToken).editMessage({
      agentId: "demo",
      conversationId: "c-discord",
      messageId: "anything",
      actor: actor("alice"),
      text: "edited",
    });
    expect(await codeOf(edit)).toBe(Code.PermissionDenied);
    const subscribe = (async () => {
      for await (const _ of connectClient(EmissionService, keel.url, slackToken).subscribe({ connector: "discord" })) break;
    })();
    expect(await codeOf(subscribe)).toBe(Code.PermissionDenied);
  });

  it("cannot cancel, answer, continue or acknowledge another connector's runs and emissions", async () => {
    const { runId } = await submit(keel.tokens.connector, "discord", "c-victim");
    const ingress = connectClient(IngressService, keel.url, slackToken);
    expect(await codeOf(ingress.cancelRun({ runId, actor: actor("alice"), reason: "mine now" }))).toBe(Code.PermissionDenied);
    expect(await codeOf(ingress.answerInput({ runId, actor: actor("alice"), text: "yes" }))).toBe(Code.PermissionDenied);
    expect(await codeOf(ingress.continueRun({ runId, actor: actor("alice"), text: "go on" }))).toBe(Code.PermissionDenied);
    const emission = await firstEmission("discord");
    const ack = connectClient(EmissionService, keel.url, slackToken).acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED });
    expect(await codeOf(ack)).toBe(Code.PermissionDenied);
    // The owner may: the refusals above were about scope, not about the calls.
    const owned = connectClient(EmissionService, keel.url, keel.tokens.connector).acknowledgeEmission({ emissionId: emission.id, outcome: DeliveryStatus.DELIVERED });
    expect(await codeOf(owned)).toBe("ok");
  });

  it("acknowledges in batches all or none: one emission outside its scope or missing settles none", async () => {
    await submit(slackToken, "slack", "c-batch-own");
    await submit(slackToken, "slack", "c-batch-own-2");
    await submit(keel.tokens.connector, "discord", "c-batch-other");
    const own = await firstEmission("slack", "c-batch-own");
    const own2 = await firstEmission("slack", "c-batch-own-2");
    const other = await firstEmission("discord", "c-batch-other");
    const emissions = connectClient(EmissionService, keel.url, slackToken);
    const delivered = (emissionId: string) => ({ emissionId, outcome: DeliveryStatus.DELIVERED });
    expect(await codeOf(emissions.acknowledgeEmissions({ acknowledgements: [delivered(own.id), delivered(other.id)] }))).toBe(Code.PermissionDenied);
    expect(await codeOf(emissions.acknowledgeEmissions({ acknowledgements: [delivered(own.id), delivered("00000000-0000-4000-8000-000000000000")] }))).toBe(Code.NotFound);
    // Neither refusal settled its own emission: the first outcome that lands is this one. The
    // response lists the emissions in request order.
    const { emissions: settled } = await emissions.acknowledgeEmissions({
      acknowledgements: [delivered(own2.id), { emissionId: own.id, outcome: DeliveryStatus.FAILED, detail: "bot kicked" }],
    });
    expect(settled.map((e) => [e.id, e.deliveryStatus])).toEqual([
      [own2.id, DeliveryStatus.DELIVERED],
      [own.id, DeliveryStatus.FAILED],
    ]);
    // Again: each keeps its first outcome.
    const { emissions: again } = await emissions.acknowledgeEmissions({ acknowledgements: [delivered(own.id)] });
    expect(again.map((e) => e.deliveryStatus)).toEqual([DeliveryStatus.FAILED]);
    // Oversized batches are refused before anything is read.
    const tooMany = Array.from({ length: 501 }, () => delivered(own.id));
    expect(await codeOf(emissions.acknowledgeEmissions({ acknowledgements: tooMany }))).toBe(Code.ResourceExhausted);
  });

  it("is held to its scope over @grpc/grpc-js too", async () => {
    const client = await grpcJsClient(keel.url, "ingress_service.proto", "IngressService");
    try {
      const metadata = grpcJsBearer(slackToken);
      const request = { agent_id: "demo", conversation_id: "c-grpc", connector: "discord", actor: actor("alice"), message_id: "g1", text: "hi" };
      const error = await new Promise<grpc.ServiceError | null>((resolve) => {
        const stub = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata, cb: (e: grpc.ServiceError | null) => void) => void>)["SubmitMessage"]!;
        stub.call(client, request, metadata, (e) => resolve(e));
      });
      expect(error?.code).toBe(grpc.status.PERMISSION_DENIED);
      expect(error?.details).toMatch(/connector/);
    } finally {
      client.close();
    }
  });

  it("cancels a run only as an actor the agent's interrupt scope lets in", async () => {
    const { runId } = await submit(slackToken, "slack", "c-strict", "strict", "alice");
    const ingress = connectClient(IngressService, keel.url, slackToken);
    const refused = await ingress.cancelRun({ runId, actor: actor("mallory"), reason: "stop" }).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(refused?.code).toBe(Code.PermissionDenied);
    expect(refused?.rawMessage).toMatch(/same_actor_only/);
    expect(await codeOf(ingress.cancelRun({ runId, actor: actor("alice"), reason: "stop" }))).toBe("ok");
  });
});

describe("revocation and expiry", () => {
  it("refuses a revoked token at once and ends its open Subscribe within 5 s, revoked from another process", async () => {
    const { id, secret } = await keel.app.tokens.create("connector", "doomed", { scope: { kind: "connector", connectors: ["slack"], agents: "any" } });
    const ingress = connectClient(IngressService, keel.url, secret);
    expect(await codeOf(submit(secret, "slack", "c-revoke"))).toBe("ok");
    let opened = false;
    const stream = (async () => {
      const call = connectClient(EmissionService, keel.url, secret).subscribe({ connector: "slack" }, { signal: AbortSignal.timeout(20_000) });
      opened = true;
      for await (const _ of call);
    })();
    await expect.poll(() => opened).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 300)); // the stream is open on the server
    // Another repository (as another process would) revokes: only NOTIFY tells this server.
    const elsewhere = createApiTokenRepository(keel.app.ledger.sql);
    const revokedAt = Date.now();
    expect(await elsewhere.revoke(id)).toBe(true);
    expect(await codeOf(stream)).toBe(Code.Unauthenticated);
    expect(Date.now() - revokedAt).toBeLessThan(5_000);
    await expect.poll(() => codeOf(ingress.cancelRun({ runId: crypto.randomUUID(), actor: actor("a"), reason: "" })), { timeout: 2_000 }).toBe(Code.Unauthenticated);
  });

  it("refuses an expired token, and ends a stream when its token expires", async () => {
    const past = await keel.app.tokens.create("connector", "old", { scope: { kind: "connector", connectors: "any", agents: "any" }, expiresAt: new Date(Date.now() - 1_000) });
    expect(await codeOf(submit(past.secret, "slack", "c-expired"))).toBe(Code.Unauthenticated);
    const soon = await keel.app.tokens.create("connector", "brief", {
      scope: { kind: "connector", connectors: "any", agents: "any" },
      expiresAt: new Date(Date.now() + 1_500),
    });
    const started = Date.now();
    const stream = (async () => {
      for await (const _ of connectClient(EmissionService, keel.url, soon.secret).subscribe({ connector: "quiet" }, { signal: AbortSignal.timeout(20_000) }));
    })();
    expect(await codeOf(stream)).toBe(Code.Unauthenticated);
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});

function countingSql(): { readonly sql: Sql; readonly lookups: () => number } {
  let lookups = 0;
  const real = keel.app.ledger.sql;
  const counting: Sql = { ...real, run: (statement, params) => (lookups++, real.run(statement, params)), query: (q) => real.query(q), transaction: (w, k) => real.transaction(w, k), notify: (c, p) => real.notify(c, p) };
  return { sql: counting, lookups: () => lookups };
}

describe("the token cache", () => {
  it("refuses a made-up secret of the issued shape by its tag, with no lookup, and still honours an untagged one issued before", async () => {
    const counted = countingSql();
    const tokens = createApiTokenRepository(counted.sql);
    const { secret } = await tokens.create("connector", "tagged");
    expect(secret).toMatch(/^keel_connector_[A-Za-z0-9_-]{43}$/);
    const before = counted.lookups();
    // One character of the random part changed, the tag kept; then wholly random ones.
    const flipped = `${secret.slice(0, 20)}${secret[20] === "A" ? "B" : "A"}${secret.slice(21)}`;
    expect(await tokens.principalOf(flipped)).toBeUndefined();
    for (let i = 0; i < 100; i++) expect(await tokens.principalOf(`keel_connector_${Math.random().toString(36).slice(2).padEnd(43, "q")}`)).toBeUndefined();
    expect(counted.lookups()).toBe(before);
    expect((await tokens.principalOf(secret))?.role).toBe("connector");
    expect(counted.lookups()).toBe(before + 1);

    // A secret from before the tag: stored as its hash like any other, looked up as before.
    const untagged = `keel_connector_${"u".repeat(31)}1`;
    await keel.app.ledger.sql.query(
      sql`INSERT INTO api_tokens (id, token_hash, role, label, scope) SELECT gen_random_uuid(), ${hashToken(untagged)}, 'connector', 'untagged', scope FROM api_tokens WHERE label = 'slack bot'`,
    );
    expect((await tokens.principalOf(untagged))?.role).toBe("connector");
    expect(await codeOf(submit(untagged, "slack", "c-untagged"))).toBe("ok");
    expect(await codeOf(submit(flipped, "slack", "c-flipped"))).toBe(Code.Unauthenticated);
  });

  it("looks an unknown secret up once per TTL and keeps a busy token across 12,000 strangers", async () => {
    const counted = countingSql();
    // The clock stands still: under a loaded CI the loop below may outlast the 5 s TTLs, and
    // what is checked here is the cache's size rule, not its timing.
    const frozen = Date.now();
    const tokens = createApiTokenRepository(counted.sql, () => frozen);
    const { secret } = await tokens.create("operator", "busy");
    let base = counted.lookups();
    expect((await tokens.principalOf(secret))?.role).toBe("operator");
    const stranger = `keel_connector_${"x".repeat(32)}`;
    for (let i = 0; i < 1_000; i++) expect(await tokens.principalOf(stranger)).toBeUndefined();
    expect(counted.lookups() - base).toBe(2);
    // Garbage that no issued secret could be costs nothing.
    expect(await tokens.principalOf("not-a-keel-token")).toBeUndefined();
    expect(counted.lookups() - base).toBe(2);
    for (let i = 0; i < 12_000; i++) {
      await tokens.principalOf(`keel_connector_${i.toString().padStart(32, "0")}`);
      if (i % 1_000 === 0) await tokens.principalOf(secret);
    }
    base = counted.lookups();
    expect((await tokens.principalOf(secret))?.role).toBe("operator");
    // Still cached: a cache that overflowed by clearing everything would have looked it up again.
    expect(counted.lookups()).toBe(base);
  }, 120_000);
});
