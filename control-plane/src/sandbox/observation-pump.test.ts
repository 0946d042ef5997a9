import { StringDecoder } from "node:string_decoder";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { ObservationText } from "../domain/sandbox.js";
import { createObservationPump, HIGH_WATER_BYTES, MAX_OBSERVATION_BYTES, stillNeeded } from "./observation-pump.js";

const bytes = (text: string) => Buffer.from(text, "utf8");
/** What the ledger stores for an observation: bytes are its UTF-8. */
const asText = (text: ObservationText) => (typeof text === "string" ? text : Buffer.from(text.buffer, text.byteOffset, text.byteLength).toString("utf8"));
const tick = () => new Promise((resolve) => setImmediate(resolve));

/** A sink that records what it was given, in call order, and lets the test decide when writes finish. */
function slowSink() {
  const written: { stream: string; text: string; asBytes: boolean }[] = [];
  const pending: (() => void)[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  return {
    written,
    get maxInFlight() {
      return maxInFlight;
    },
    sink: (stream: string, text: ObservationText) => {
      written.push({ stream, text: asText(text), asBytes: typeof text !== "string" });
      inFlight += 1;
      maxInFlight = Math.max(maxInFlight, inFlight);
      return new Promise<void>((resolve) =>
        pending.push(() => {
          inFlight -= 1;
          resolve();
        }),
      );
    },
    /** Finishes every write started so far. */
    settle() {
      for (const done of pending.splice(0)) done();
    },
  };
}

/** Finishes writes as they come until `work` is done. */
async function settleUntil(sink: ReturnType<typeof slowSink>, work: Promise<unknown>): Promise<void> {
  let done = false;
  const finished = work.finally(() => (done = true));
  while (!done) {
    sink.settle();
    await tick();
  }
  await finished;
}

describe("observation pump (issue #4: streaming into the ledger)", () => {
  it("keeps every byte, in order, in observations of at most MAX_OBSERVATION_BYTES, with at most two writes in flight", async () => {
    const sink = slowSink();
    const pump = createObservationPump({ secrets: [], maxBytes: 64 * 1024 * 1024, sink: sink.sink });
    let expected = "";
    for (let i = 0; i < 200; i++) {
      const text = `${String(i).padStart(4, "0")}:${"x".repeat(30_000)}\n`;
      expected += text;
      pump.push("stdout", bytes(text));
      if (i % 20 === 0) sink.settle();
    }
    await settleUntil(sink, pump.finish());
    expect(sink.written.map((w) => w.text).join("")).toBe(expected);
    expect(sink.written.every((w) => w.stream === "stdout" && w.text.length <= MAX_OBSERVATION_BYTES)).toBe(true);
    // Merged while writes were in flight: far fewer observations than chunks.
    expect(sink.written.length).toBeLessThan(50);
    expect(sink.maxInFlight).toBe(2);
  });

  it("decodes a character split across chunks, switching between ASCII and UTF-8 chunks", async () => {
    const written: string[] = [];
    const pump = createObservationPump({ secrets: [], maxBytes: 1024, sink: async (_s, text) => void written.push(asText(text)) });
    const text = "plain ascii, then é and 😀, then ascii again";
    const encoded = bytes(text);
    // Cut every way: inside the 2-byte é and the 4-byte emoji, and at ASCII boundaries.
    for (let i = 0; i < encoded.length; i += 3) {
      pump.push("stdout", encoded.subarray(i, i + 3));
      await tick();
    }
    await pump.finish();
    expect(written.join("")).toBe(text);
  });

  it("ends a stream cut inside a character with a replacement character, as a UTF-8 decoder would", async () => {
    const written: string[] = [];
    const pump = createObservationPump({ secrets: [], maxBytes: 1024, sink: async (_s, text) => void written.push(asText(text)) });
    pump.push("stdout", Buffer.from([0x61, 0xe2, 0x82]));
    await pump.finish();
    expect(written.join("")).toBe("a\uFFFD");
  });

  it("redacts a secret split across chunks, and replaces NUL only where there is one", async () => {
    const written: string[] = [];
    const pump = createObservationPump({
      secrets: [{ name: "TOKEN", value: "s3cr3t-value" }],
      maxBytes: 1024,
      sink: async (_s, text) => void written.push(asText(text)),
    });
    for (const part of ["token=s3c", "r3t-", "value done\0", "\n"]) {
      pump.push("stdout", bytes(part));
      await tick();
    }
    await pump.finish();
    expect(written.join("")).toBe("token=[redacted:TOKEN] done\u2400\n");
  });

  it("issue #12: output cut at the cap keeps no secret and no secret's start, whatever the chunks and the cap", async () => {
    const secret = fc.string({ unit: fc.constantFrom("a", "b", "x", "=", "é"), minLength: 4, maxLength: 20 });
    await fc.assert(
      fc.asyncProperty(
        fc.uniqueArray(secret, { minLength: 1, maxLength: 3 }).chain((values) =>
          fc.tuple(
            fc.constant(values),
            fc.array(fc.oneof(fc.constantFrom(...values), fc.string({ unit: fc.constantFrom("a", "b", " ", "\n"), maxLength: 6 })), { maxLength: 10 }),
            fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 1, maxLength: 8 }),
            fc.nat(),
            fc.boolean(),
          ),
        ),
        async ([values, parts, sizes, capSeed, hostCut]) => {
          const secrets = values.map((value, i) => ({ name: `S${i}`, value }));
          const output = bytes(parts.join(""));
          const cap = 1 + (capSeed % (output.length + 1));
          const stored = { stdout: "", stderr: "" };
          const pump = createObservationPump({ secrets, maxBytes: cap, sink: async (stream, text) => void (stored[stream as "stdout"] += asText(text)) });
          // Chunks of the given sizes, alternating with a little stderr that holds a secret too.
          for (let at = 0, i = 0; at < output.length; i++) {
            const size = sizes[i % sizes.length]!;
            pump.push("stdout", output.subarray(at, at + size));
            if (i === 1) pump.push("stderr", bytes(values[0]!));
            at += size;
            await tick();
          }
          // A host that truncated says so; this pump's own cap cuts whatever passed it.
          await pump.finish(hostCut);
          for (const text of [stored.stdout, stored.stderr]) {
            for (const { value } of secrets) {
              expect(text).not.toContain(value);
              // A secret's start of four or more characters never ends what was kept.
              if (pump.truncated || hostCut) for (let n = 4; n < value.length; n++) expect(text.endsWith(value.slice(0, n))).toBe(false);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it("hands whole, valid UTF-8 without NUL over as its bytes when there is nothing to redact, and decodes the rest", async () => {
    const sink = slowSink();
    const pump = createObservationPump({ secrets: [], maxBytes: 1024, sink: sink.sink });
    const steps: [Buffer, boolean][] = [
      [bytes("plain ascii\n"), true],
      [bytes("caf\u00e9 \u{1F600}\n"), true], // valid UTF-8, whole characters
      [bytes("half \u00e9").subarray(0, 6), false], // ends inside a character: the decoder keeps it
      [bytes("\u00e9 rest\n").subarray(1), false], // the character's end, after what the decoder held
      [bytes("after\n"), true],
      [Buffer.from([0x6e, 0x75, 0x6c, 0x00, 0x0a]), false], // NUL: stored with a stand-in
      [Buffer.from([0x62, 0x61, 0x64, 0xff, 0x0a]), false], // not UTF-8: a replacement character
    ];
    for (const [chunk] of steps) {
      pump.push("stdout", chunk);
      await settleUntil(sink, tick()); // one observation per chunk
    }
    await settleUntil(sink, pump.finish());
    expect(sink.written.map((w) => w.asBytes)).toEqual(steps.map(([, asBytes]) => asBytes));
    expect(sink.written.map((w) => w.text).join("")).toBe("plain ascii\ncaf\u00e9 \u{1F600}\nhalf \u00e9 rest\nafter\nnul\u2400\nbad\uFFFD\n");
  });

  it("never hands bytes over while a secret is to be redacted", async () => {
    const sink = slowSink();
    const pump = createObservationPump({ secrets: [{ name: "TOKEN", value: "hunter2" }], maxBytes: 1024, sink: sink.sink });
    pump.push("stdout", bytes("nothing secret here\n"));
    await settleUntil(sink, pump.finish());
    expect(sink.written.every((w) => !w.asBytes)).toBe(true);
    expect(sink.written.map((w) => w.text).join("")).toBe("nothing secret here\n");
  });

  it("asks its feeder to wait past the high-water mark and lets it go on once the ledger caught up", async () => {
    const sink = slowSink();
    const pump = createObservationPump({ secrets: [], maxBytes: 64 * 1024 * 1024, sink: sink.sink });
    const chunk = Buffer.alloc(256 * 1024, "a");
    let pushed = 0;
    while (pump.backlog() === undefined) {
      pump.push("stdout", chunk);
      pushed += chunk.length;
      expect(pushed).toBeLessThanOrEqual(HIGH_WATER_BYTES + 2 * MAX_OBSERVATION_BYTES + chunk.length);
    }
    let released = false;
    const waiting = pump.backlog()!.then(() => (released = true));
    await tick();
    expect(released).toBe(false);
    await settleUntil(sink, waiting);
    expect(pump.backlog()).toBeUndefined();
    await settleUntil(sink, pump.finish());
    expect(sink.written.reduce((sum, w) => sum + w.text.length, 0)).toBe(pushed);
  });

  it("stops writing after a failed write, lets its feeder go, and rethrows from finish()", async () => {
    let calls = 0;
    const pump = createObservationPump({
      secrets: [],
      maxBytes: 64 * 1024 * 1024,
      sink: async () => {
        calls += 1;
        throw new Error("ledger down");
      },
    });
    for (let i = 0; i < 40; i++) pump.push("stdout", Buffer.alloc(512 * 1024, "a"));
    const backlog = pump.backlog();
    if (backlog !== undefined) await backlog;
    await expect(pump.finish()).rejects.toThrow("ledger down");
    expect(calls).toBeLessThanOrEqual(2);
  });
});

describe("observation pump, a sink that throws", () => {
  it("keeps the throw out of push() and rethrows it from finish()", async () => {
    const pump = createObservationPump({
      secrets: [],
      maxBytes: 1024,
      sink: () => {
        throw new Error("not even a promise");
      },
    });
    expect(() => pump.push("stdout", bytes("hello\n"))).not.toThrow();
    await expect(pump.finish()).rejects.toThrow("not even a promise");
  });
});

describe("stillNeeded", () => {
  it("matches what a UTF-8 decoder holds back, whatever the cut", () => {
    const samples = ["a😀b", "é", "€x", "ab\u00e9\u20ac\ud83d\ude00", "\xff\xfe", "x"].map((t) => Buffer.from(t, t.startsWith("\xff") ? "latin1" : "utf8"));
    samples.push(Buffer.from([0xc0, 0x41]), Buffer.from([0xf0, 0x9f, 0x41]), Buffer.from([0x80, 0x80, 0x41]), Buffer.from([0xf4, 0x8f, 0xbf, 0xbf]));
    for (const sample of samples) {
      for (let size = 1; size <= 4; size++) {
        const decoder = new StringDecoder("utf8") as StringDecoder & { lastNeed: number };
        let need = 0;
        for (let i = 0; i < sample.length; i += size) {
          const chunk = sample.subarray(i, i + size);
          decoder.write(chunk);
          need = stillNeeded(need, chunk);
          // Never less than the decoder waits for: ASCII after it must go through the decoder.
          if (decoder.lastNeed > 0) expect(need).toBeGreaterThan(0);
        }
      }
    }
  });
});

describe("observation pump, any text cut anywhere", () => {
  it("stores exactly the text, whatever the chunks", async () => {
    await fc.assert(
      fc.asyncProperty(fc.string({ unit: "binary", maxLength: 200 }), fc.array(fc.integer({ min: 1, max: 7 }), { minLength: 1, maxLength: 20 }), async (text, sizes) => {
        const written: string[] = [];
        const pump = createObservationPump({ secrets: [], maxBytes: 1 << 20, sink: async (_s, t) => void written.push(asText(t)) });
        const encoded = Buffer.from(text, "utf8");
        for (let i = 0, k = 0; i < encoded.length; k++) {
          const size = sizes[k % sizes.length]!;
          pump.push("stdout", encoded.subarray(i, i + size));
          i += size;
        }
        await pump.finish();
        expect(written.join("")).toBe(encoded.toString("utf8").replaceAll("\0", "\u2400"));
      }),
    );
  });
});
