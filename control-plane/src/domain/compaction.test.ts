import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  compactToolResults,
  DEFAULT_COMPACTION,
  EXCERPT_LINE_MAX_CHARS,
  type CompactionOptions,
} from "./compaction.js";
import { byteLength } from "./ids.js";
import type { ModelMessage } from "./transcript.js";

type ToolMessage = Extract<ModelMessage, { role: "tool" }>;

function tool(toolCallId: string, content: string): ToolMessage {
  return { role: "tool", toolCallId, content };
}

function numberedLines(count: number, width = 20): string {
  return Array.from({ length: count }, (_, i) => `line ${i}`.padEnd(width, ".")).join("\n");
}

function toolContents(messages: readonly ModelMessage[]): string[] {
  return messages.filter((m): m is ToolMessage => m.role === "tool").map((m) => m.content);
}

describe("compactToolResults: examples", () => {
  const options: CompactionOptions = { keepRecent: 1, verbatimByteBudget: 0, excerptLines: 2 };

  it("replaces an old result with head, marker and tail", () => {
    const big = numberedLines(10);
    const messages: ModelMessage[] = [
      { role: "system", content: "be useful" },
      { role: "user", content: "go" },
      { role: "assistant", content: "", toolCalls: [{ id: "c1", name: "fs.read.v1", argumentsJson: "{}" }] },
      tool("c1", big),
      { role: "assistant", content: "", toolCalls: [{ id: "c2", name: "fs.read.v1", argumentsJson: "{}" }] },
      tool("c2", big),
    ];
    const out = compactToolResults(messages, { c1: "inv-1", c2: "inv-2" }, options);
    const lines = big.split("\n");
    const keptBytes = byteLength([lines[0], lines[1]].join("\n")) + byteLength([lines[8], lines[9]].join("\n"));
    expect(out[3]).toEqual(
      tool(
        "c1",
        [
          lines[0],
          lines[1],
          `[… ${byteLength(big) - keptBytes} bytes, 6 lines elided; full text in the run ledger as tool invocation inv-1]`,
          lines[8],
          lines[9],
        ].join("\n"),
      ),
    );
    expect(out[5]).toBe(messages[5]);
    expect(out.slice(0, 3)).toEqual(messages.slice(0, 3));
  });

  it("uses the default options when none are given", () => {
    const big = numberedLines(200);
    const messages = Array.from({ length: 4 }, (_, i) => tool(`c${i}`, big));
    const out = compactToolResults(messages, {});
    // 3 newest verbatim; the oldest fits the 32 KiB budget.
    expect(byteLength(big)).toBeLessThan(DEFAULT_COMPACTION.verbatimByteBudget);
    expect(out).toEqual(messages);
    const more = Array.from({ length: 12 }, (_, i) => tool(`c${i}`, big));
    const compacted = compactToolResults(more, {});
    const changed = compacted.filter((m, i) => m !== more[i]).length;
    // 3 recent + floor(32768 / 4199) older kept verbatim; the rest compacted.
    expect(changed).toBe(12 - 3 - Math.floor(32 * 1024 / byteLength(big)));
  });

  it("keeps older results verbatim while the running total fits the budget, then stops", () => {
    const a = numberedLines(30); // oldest
    const b = numberedLines(30);
    const c = numberedLines(30);
    const tiny = "ok";
    const size = byteLength(a);
    const messages = [tool("a", a), tool("tiny", tiny), tool("b", b), tool("c", c), tool("d", "newest")];
    const out = compactToolResults(messages, {}, { keepRecent: 1, verbatimByteBudget: 2 * size, excerptLines: 1 });
    expect(out[3]).toBe(messages[3]); // c: fits
    expect(out[2]).toBe(messages[2]); // b: fits (total = 2·size)
    expect(out[1]).toBe(messages[1]); // tiny: over budget, but an excerpt would not be smaller
    expect(out[0]).not.toBe(messages[0]); // a: over budget → excerpt
    expect((out[0] as ToolMessage).content).toContain("tool call a]");
  });

  it("keeps short results verbatim even past the budget", () => {
    const messages = [tool("a", "one\ntwo\nthree"), tool("b", "x")];
    expect(compactToolResults(messages, { a: "r" }, { keepRecent: 0, verbatimByteBudget: 0, excerptLines: 1 })).toEqual(
      messages,
    );
  });

  it("clips enormous single lines", () => {
    const huge = `{"data":"${"z".repeat(100_000)}"}`;
    const out = compactToolResults([tool("a", huge)], { a: "inv-a" }, { keepRecent: 0, verbatimByteBudget: 0, excerptLines: 3 });
    const content = (out[0] as ToolMessage).content;
    expect(byteLength(content)).toBeLessThan(700);
    const [first, mark] = content.split("\n");
    expect(first?.length).toBe(EXCERPT_LINE_MAX_CHARS);
    expect(first?.endsWith("…")).toBe(true);
    expect(huge.startsWith(first?.slice(0, -1) ?? "?")).toBe(true);
    expect(mark).toBe(
      `[… ${byteLength(huge) - (EXCERPT_LINE_MAX_CHARS - 1)} bytes, 0 lines elided; full text in the run ledger as tool invocation inv-a]`,
    );
  });

  it("does not split a surrogate pair when clipping", () => {
    const emoji = "😀".repeat(1_000);
    const out = compactToolResults([tool("a", emoji)], {}, { keepRecent: 0, verbatimByteBudget: 0, excerptLines: 1 });
    const first = (out[0] as ToolMessage).content.split("\n")[0] ?? "";
    expect(first.endsWith("😀…")).toBe(true);
    expect(first.length).toBeLessThanOrEqual(EXCERPT_LINE_MAX_CHARS);
  });

  it("does not mutate its input", () => {
    const messages = [tool("a", numberedLines(50)), tool("b", "recent")];
    const copy = structuredClone(messages);
    compactToolResults(messages, {}, { keepRecent: 1, verbatimByteBudget: 0, excerptLines: 1 });
    expect(messages).toEqual(copy);
  });

  it("ignores inherited names in refs", () => {
    const out = compactToolResults([tool("constructor", numberedLines(50))], {}, {
      keepRecent: 0,
      verbatimByteBudget: 0,
      excerptLines: 1,
    });
    expect((out[0] as ToolMessage).content).toContain("as tool call constructor]");
  });
});

// ---- properties ----

const line = fc.oneof(
  { weight: 8, arbitrary: fc.string({ maxLength: 60 }).map((s) => s.replace(/\n/g, " ")) },
  { weight: 1, arbitrary: fc.string({ minLength: 400, maxLength: 1_500 }).map((s) => s.replace(/\n/g, " ")) },
  { weight: 1, arbitrary: fc.constant("[… 12 bytes, 3 lines elided; full text in the run ledger as tool invocation x]") },
);
const content = fc.oneof(
  fc.array(line, { maxLength: 80 }).map((lines) => lines.join("\n")),
  fc.string({ maxLength: 40 }),
);

interface Scenario {
  readonly messages: ModelMessage[];
  readonly refs: Record<string, string>;
  readonly options: CompactionOptions;
}

const scenario: fc.Arbitrary<Scenario> = fc
  .record({
    kinds: fc.array(fc.constantFrom("system", "user", "assistant", "tool", "tool", "tool"), { maxLength: 30 }),
    contents: fc.array(content, { minLength: 30, maxLength: 30 }),
    refIds: fc.array(fc.oneof(fc.uuid(), fc.constant("")), { minLength: 30, maxLength: 30 }),
    options: fc.record({
      keepRecent: fc.nat({ max: 5 }),
      verbatimByteBudget: fc.oneof(fc.constant(0), fc.nat({ max: 20_000 })),
      excerptLines: fc.integer({ min: 1, max: 5 }),
    }),
  })
  .map(({ kinds, contents, refIds, options }) => {
    const refs: Record<string, string> = {};
    const messages = kinds.map((kind, i): ModelMessage => {
      const text = contents[i] ?? "";
      const id = `call-${i}`;
      const ref = refIds[i] ?? "";
      if (ref !== "") refs[id] = ref;
      switch (kind) {
        case "system":
          return { role: "system", content: text };
        case "user":
          return { role: "user", content: text, actorId: "U1" };
        case "assistant":
          return { role: "assistant", content: text, toolCalls: [{ id, name: "t.x.v1", argumentsJson: "{}" }] };
        default:
          return tool(id, text);
      }
    });
    return { messages, refs, options };
  });

function pointerText(message: ToolMessage, refs: Record<string, string>): string {
  const ref = refs[message.toolCallId];
  return ref === undefined ? `tool call ${message.toolCallId}` : `tool invocation ${ref}`;
}

describe("compactToolResults: properties", () => {
  it("(a) same length, roles and tool call ids", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const out = compactToolResults(messages, refs, options);
        expect(out.length).toBe(messages.length);
        out.forEach((m, i) => {
          const before = messages[i];
          expect(m.role).toBe(before?.role);
          if (m.role === "tool" && before?.role === "tool") expect(m.toolCallId).toBe(before.toolCallId);
        });
      }),
    );
  });

  it("(b) non-tool messages are identical", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const out = compactToolResults(messages, refs, options);
        out.forEach((m, i) => {
          if (m.role !== "tool") expect(m).toBe(messages[i]);
        });
      }),
    );
  });

  it("(c) the newest keepRecent tool results are verbatim", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const before = toolContents(messages);
        const after = toolContents(compactToolResults(messages, refs, options));
        const recent = Math.min(options.keepRecent, before.length);
        expect(after.slice(after.length - recent)).toEqual(before.slice(before.length - recent));
      }),
    );
  });

  it("(d) every changed result names its ref and starts with its first line", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const out = compactToolResults(messages, refs, options);
        out.forEach((m, i) => {
          const before = messages[i];
          if (m.role !== "tool" || before?.role !== "tool" || m.content === before.content) return;
          expect(m.content).toContain(`${pointerText(before, refs)}]`);
          const firstLine = before.content.split("\n")[0] ?? "";
          const shownFirst = m.content.split("\n")[0] ?? "";
          if (firstLine.length <= EXCERPT_LINE_MAX_CHARS) expect(shownFirst).toBe(firstLine);
          else expect(firstLine.startsWith(shownFirst.slice(0, -1))).toBe(true);
        });
      }),
    );
  });

  it("(e) idempotent", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const once = compactToolResults(messages, refs, options);
        expect(compactToolResults(once, refs, options)).toEqual(once);
      }),
    );
  });

  it("(f) never grows the tool content", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const bytes = (ms: readonly ModelMessage[]) => toolContents(ms).reduce((sum, c) => sum + byteLength(c), 0);
        const out = compactToolResults(messages, refs, options);
        expect(bytes(out)).toBeLessThanOrEqual(bytes(messages));
        out.forEach((m, i) => {
          const before = messages[i];
          if (m.role === "tool" && before?.role === "tool") {
            expect(byteLength(m.content)).toBeLessThanOrEqual(byteLength(before.content));
          }
        });
      }),
    );
  });

  it("deterministic", () => {
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        expect(compactToolResults(messages, refs, options)).toEqual(compactToolResults(messages, refs, options));
      }),
    );
  });

  it("a result is only compacted once the older results from it to the newest no longer fit the budget", () => {
    let compactedSomething = 0;
    fc.assert(
      fc.property(scenario, ({ messages, refs, options }) => {
        const before = toolContents(messages);
        const after = toolContents(compactToolResults(messages, refs, options));
        const older = before.length - Math.min(options.keepRecent, before.length);
        let cumulative = 0;
        for (let i = older - 1; i >= 0; i--) {
          cumulative += byteLength(before[i] ?? "");
          if (after[i] !== before[i]) {
            compactedSomething++;
            expect(cumulative).toBeGreaterThan(options.verbatimByteBudget);
          }
        }
      }),
    );
    expect(compactedSomething).toBeGreaterThan(0); // the generators do exercise compaction
  });
});
