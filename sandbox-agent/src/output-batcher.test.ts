import { describe, expect, it, vi } from "vitest";
import { BURST_BYTES, LINGER_MS, OutputBatcher, TAIL_BYTES, type OutputOutlet } from "./output-batcher.js";
import type { OutputStreamName } from "./workspace-backend.js";

const tick = () => new Promise((resolve) => setImmediate(resolve));

/** An outlet whose transport is idle or busy as the test says; a busy one flushes when told it asks for more. */
function fakeOutlet(maxChunkBytes: number) {
  const sent: { stream: OutputStreamName; text: string }[] = [];
  const held = new Set<OutputBatcher>();
  const outlet: OutputOutlet & { waiting: boolean } = {
    waiting: true,
    maxChunkBytes,
    get transportWaiting() {
      return this.waiting;
    },
    send: (stream, chunk) => void sent.push({ stream, text: Buffer.from(chunk).toString() }),
    holding: (batcher) => void held.add(batcher),
  };
  return {
    outlet,
    sent,
    /** The transport asks for its next message. */
    hungry() {
      for (const batcher of held) batcher.ready();
      held.clear();
    },
  };
}

describe("output batcher (issue #4: few, large output messages)", () => {
  it("sends a small output at once when the transport is idle, merged with what arrived in the same turn", async () => {
    const { outlet, sent } = fakeOutlet(1024);
    const batcher = new OutputBatcher(outlet);
    batcher.push("stdout", Buffer.from("hello "));
    batcher.push("stdout", Buffer.from("world\n"));
    expect(sent).toEqual([]);
    await tick();
    expect(sent).toEqual([{ stream: "stdout", text: "hello world\n" }]);
  });

  it("holds output while the transport is busy and sends it as one message when it asks for more", async () => {
    const fake = fakeOutlet(1024);
    fake.outlet.waiting = false;
    const batcher = new OutputBatcher(fake.outlet);
    for (let i = 0; i < 10; i++) batcher.push("stdout", Buffer.from(`line ${i}\n`));
    await tick();
    expect(fake.sent).toEqual([]);
    fake.hungry();
    expect(fake.sent.map((s) => s.text)).toEqual([Array.from({ length: 10 }, (_, i) => `line ${i}\n`).join("")]);
  });

  it("lets a fast producer's output linger a few milliseconds, so an idle transport gets few, large messages", () => {
    // The clock is the test's: a loaded machine must not let the linger run out between two pushes.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setImmediate", "clearImmediate"] });
    try {
      const fake = fakeOutlet(1 << 20);
      const batcher = new OutputBatcher(fake.outlet);
      batcher.push("stdout", Buffer.alloc(BURST_BYTES, "a"));
      vi.advanceTimersByTime(0);
      expect(fake.sent).toEqual([]);
      batcher.push("stdout", Buffer.alloc(BURST_BYTES, "b"));
      vi.advanceTimersByTime(LINGER_MS - 1);
      expect(fake.sent).toEqual([]);
      vi.advanceTimersByTime(1);
      expect(fake.sent.map((s) => s.text)).toEqual([`${"a".repeat(BURST_BYTES)}${"b".repeat(BURST_BYTES)}`]);
    } finally {
      vi.useRealTimers();
    }
  });

  it("sends a lingering message as soon as it reaches the chunk size, and at once when the exec ends", async () => {
    const fake = fakeOutlet(3 * BURST_BYTES);
    const batcher = new OutputBatcher(fake.outlet);
    batcher.push("stdout", Buffer.alloc(2 * BURST_BYTES, "a"));
    await tick();
    batcher.push("stdout", Buffer.alloc(2 * BURST_BYTES, "b"));
    expect(fake.sent.map((s) => s.text.length)).toEqual([3 * BURST_BYTES]);
    batcher.flush();
    expect(fake.sent.map((s) => s.text.length)).toEqual([3 * BURST_BYTES, BURST_BYTES]);
  });

  it("lets a fast producer's output linger when a busy transport asks for more", async () => {
    const fake = fakeOutlet(1 << 20);
    fake.outlet.waiting = false;
    const batcher = new OutputBatcher(fake.outlet);
    batcher.push("stdout", Buffer.alloc(BURST_BYTES, "a"));
    fake.outlet.waiting = true;
    fake.hungry();
    expect(fake.sent).toEqual([]);
    batcher.push("stdout", Buffer.from("tail"));
    await new Promise((resolve) => setTimeout(resolve, LINGER_MS + 20));
    expect(fake.sent.map((s) => s.text.length)).toEqual([BURST_BYTES + 4]);
  });

  it("never sends more than the announced chunk size in one message, and keeps stdout and stderr apart", () => {
    const fake = fakeOutlet(100);
    fake.outlet.waiting = false;
    const batcher = new OutputBatcher(fake.outlet);
    batcher.push("stdout", Buffer.from("a".repeat(250)));
    batcher.push("stderr", Buffer.from("e".repeat(30)));
    batcher.push("stdout", Buffer.from("b".repeat(90)));
    batcher.push("stdout", Buffer.from("c".repeat(20)));
    fake.hungry();
    expect(fake.sent.map((s) => [s.stream, s.text.length])).toEqual([
      ["stdout", 100],
      ["stdout", 100],
      ["stdout", 50],
      ["stderr", 30],
      ["stdout", 100],
      ["stdout", 10],
    ]);
    expect(fake.sent.map((s) => s.text).join("")).toBe(`${"a".repeat(250)}${"e".repeat(30)}${"b".repeat(90)}${"c".repeat(20)}`);
  });

  it("keeps the last bytes of the output and counts all of it", () => {
    const { outlet } = fakeOutlet(1 << 20);
    const batcher = new OutputBatcher(outlet);
    batcher.push("stdout", Buffer.alloc(TAIL_BYTES, "x"));
    batcher.push("stdout", Buffer.from("the end"));
    batcher.flush();
    expect(batcher.bytes).toBe(TAIL_BYTES + 7);
    expect(Buffer.from(batcher.tailBytes()).toString()).toBe(`${"x".repeat(TAIL_BYTES - 7)}the end`);
  });
});
