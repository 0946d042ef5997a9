import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAgentsPageToken } from "../control-plane/src/ledger/agent.repository.js";
import { createApiTokenRepository, hashToken } from "../control-plane/src/ledger/api-token.repository.js";
import { sql } from "../control-plane/src/ledger/sql.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

// One Keel for the file: agents and tokens are both read through its ledger.
let keel: TestKeel;
beforeAll(async () => {
  keel = await startTestKeel();
});
afterAll(async () => {
  await keel.stop();
});

describe("agents in the ledger", () => {
  it("puts of one agent at the same moment all succeed, each a revision of its own (two servers starting on one database)", async () => {
    const spec = { ...DEMO_AGENT, id: "raced", displayName: "raced" };
    const stored = await Promise.all(Array.from({ length: 8 }, (_, i) => keel.app.agents.put({ ...spec, systemPrompt: `prompt ${i}` })));
    expect(stored.map((s) => s.revision).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    const latest = await keel.app.agents.get("raced");
    expect(latest?.revision).toBe(8);
    expect(stored.find((s) => s.revision === 8)?.systemPrompt).toBe(latest?.systemPrompt);
  });

  it("lists agents in id order, a page at a time", async () => {
    for (const id of ["page-a", "page-b", "page-c"]) await keel.app.agents.put({ ...DEMO_AGENT, id });
    const first = await keel.app.agents.list(2, "");
    const rest = await keel.app.agents.list(100, first.nextPageToken);
    const ids = [...first.items, ...rest.items].map((a) => a.id);
    expect(first.items).toHaveLength(2);
    expect(ids.filter((id) => id.startsWith("page-"))).toEqual(["page-a", "page-b", "page-c"]);
    expect(rest.nextPageToken).toBe("");
    // Only a token that encodes back to itself is one the ledger issued.
    expect(parseAgentsPageToken(first.nextPageToken)).toBe(first.items[1]?.id);
    for (const garbage of ["A>C.pD", "AA", "not a token", "cGFnZS1i="]) expect(parseAgentsPageToken(garbage), garbage).toBeUndefined();
  });
});

describe("API tokens", () => {
  it("trusts a checked role for 5 s, then serves it while it is checked again, then goes by the ledger", async () => {
    let now = 1_000_000;
    const tokens = createApiTokenRepository(keel.app.ledger.sql, () => now);
    const { secret } = await tokens.create("connector", "revocation test");
    expect(await tokens.roleOf(secret)).toBe("connector");
    await keel.app.ledger.sql.query(sql`UPDATE api_tokens SET revoked_at = now() WHERE token_hash = ${hashToken(secret)}`);
    // Within the trusted time the cached role stands.
    now += 4_000;
    expect(await tokens.roleOf(secret)).toBe("connector");
    // Past it, a busy caller is not made to wait: the cached role is served and a check starts...
    now += 2_000;
    expect(await tokens.roleOf(secret)).toBe("connector");
    // ...whose answer (revoked) holds from then on.
    await expect.poll(() => tokens.roleOf(secret), { timeout: 5_000 }).toBeUndefined();
    // A token unseen for longer than trusted + stale time is checked inline.
    const other = await tokens.create("operator", "idle test");
    expect(await tokens.roleOf(other.secret)).toBe("operator");
    await keel.app.ledger.sql.query(sql`UPDATE api_tokens SET revoked_at = now() WHERE token_hash = ${hashToken(other.secret)}`);
    now += 11_000;
    expect(await tokens.roleOf(other.secret)).toBeUndefined();
  });
});
