import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { expandModelRequests, requestForStorage, sameJson, type ModelRequestRecord, type PreviousModelRequest, type StoredModelRequest } from "./model-request.js";

const message = fc.record({ role: fc.constantFrom("user", "assistant", "tool"), content: fc.string({ maxLength: 20 }) });
const tools = fc.array(fc.record({ name: fc.constantFrom("a.read.v1", "b.write.v1") }), { maxLength: 2 });

/** Each request keeps a prefix of the last one (compaction rewrites what follows), adds messages, and may change the catalog. */
const requestsOfOneRun = fc
  .array(fc.record({ keep: fc.nat(), added: fc.array(message, { maxLength: 4 }), tools, reclaimed: fc.boolean() }), { minLength: 1, maxLength: 12 })
  .map((turns) => {
    const requests: { request: ModelRequestRecord; reclaimed: boolean }[] = [];
    let messages: unknown[] = [];
    for (const turn of turns) {
      messages = [...messages.slice(0, turn.keep % (messages.length + 1)), ...turn.added];
      requests.push({ request: { messages, tools: turn.tools }, reclaimed: turn.reclaimed });
    }
    return requests;
  });

function store(requests: readonly { request: ModelRequestRecord; reclaimed: boolean }[]) {
  let previous: PreviousModelRequest | undefined;
  return requests.map(({ request, reclaimed }, i) => {
    // A worker that claims the run anew remembers nothing and stores its first call whole.
    const stored = requestForStorage(`call-${i}`, request, reclaimed ? undefined : previous);
    previous = stored.remembered;
    return { id: `call-${i}`, request: stored.stored };
  });
}

describe("model requests stored as deltas", () => {
  it("expand back to exactly the requests that were sent, in any read order", () => {
    fc.assert(
      fc.property(requestsOfOneRun, fc.integer(), (requests, seed) => {
        const stored = store(requests);
        const shuffled = [...stored].sort((a, b) => ((a.id.length * seed) % 7) - ((b.id.length * seed) % 7));
        const whole = expandModelRequests(shuffled);
        requests.forEach(({ request }, i) => expect(whole.get(`call-${i}`)).toEqual(request));
      }),
    );
  });

  it("stores only what changed: a growing transcript keeps the prefix and omits an unchanged catalog", () => {
    const first = { messages: [{ role: "user", content: "go" }], tools: [{ name: "a.read.v1" }] };
    const second = { messages: [...first.messages, { role: "assistant", content: "" }, { role: "tool", content: "42" }], tools: first.tools };
    const one = requestForStorage("c1", first, undefined);
    const two = requestForStorage("c2", second, one.remembered);
    expect(one.stored).toEqual(first);
    expect(two.stored).toEqual({ base: "c1", keep: 1, messages: second.messages.slice(1) });
  });

  it("marks a request incomplete when the call it builds on is missing, and keeps what it has", () => {
    const stored: { id: string; request: StoredModelRequest }[] = [{ id: "c2", request: { base: "c1", keep: 3, messages: [{ role: "tool", content: "x" }] } }];
    expect(expandModelRequests(stored).get("c2")).toEqual({ messages: [{ role: "tool", content: "x" }], tools: [], incomplete: true });
  });

  it("survives a cycle of bases without looping", () => {
    const stored: { id: string; request: StoredModelRequest }[] = [
      { id: "a", request: { base: "b", keep: 0, messages: [] } },
      { id: "b", request: { base: "a", keep: 0, messages: [] } },
    ];
    expect(expandModelRequests(stored).get("a")?.incomplete).toBe(true);
  });

  it("compares messages as JSON would: equal after a round trip, different when any value differs", () => {
    const sorted = (value: unknown): unknown =>
      Array.isArray(value) ? value.map(sorted) : typeof value === "object" && value !== null
        ? Object.fromEntries(Object.entries(value).sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => [k, sorted(v)]))
        : value;
    fc.assert(
      fc.property(fc.jsonValue(), fc.jsonValue(), (a, b) => {
        expect(sameJson(a, JSON.parse(JSON.stringify(a)))).toBe(true);
        expect(sameJson(a, b)).toBe(JSON.stringify(sorted(a)) === JSON.stringify(sorted(b)));
      }),
    );
  });
});
