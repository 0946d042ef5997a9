import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEMO_AGENT, startTestKeel, type TestKeel } from "./support/keel-fixture.js";

describe("agents in the ledger", () => {
  let keel: TestKeel;
  beforeAll(async () => {
    keel = await startTestKeel();
  });
  afterAll(async () => {
    await keel.stop();
  });

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
  });
});
