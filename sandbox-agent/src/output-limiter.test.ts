import { describe, expect, it } from "vitest";
import { createOutputLimiter } from "./output-limiter.js";
import type { OutputStreamName } from "./workspace-backend.js";

const bytes = (text: string) => new TextEncoder().encode(text);

describe("output limiter", () => {
  it("forwards both streams until the cap together, cuts the chunk that crosses it, then drops and marks truncation", () => {
    const seen: [OutputStreamName, string][] = [];
    const limiter = createOutputLimiter(8, (stream, chunk) => seen.push([stream, new TextDecoder().decode(chunk)]));
    limiter.write("stdout", bytes("abc"));
    limiter.write("stderr", bytes("de"));
    expect(limiter.truncated).toBe(false);
    limiter.write("stdout", bytes("fghij"));
    limiter.write("stderr", bytes("k"));
    expect(seen).toEqual([
      ["stdout", "abc"],
      ["stderr", "de"],
      ["stdout", "fgh"],
    ]);
    expect(limiter.forwardedBytes).toBe(8);
    expect(limiter.truncated).toBe(true);
  });

  it("is not truncated when the output fills the cap exactly, and ignores empty chunks", () => {
    let calls = 0;
    const limiter = createOutputLimiter(4, () => calls++);
    limiter.write("stdout", new Uint8Array(0));
    limiter.write("stdout", bytes("abcd"));
    expect(calls).toBe(1);
    expect(limiter.truncated).toBe(false);
    limiter.write("stdout", new Uint8Array(0));
    expect(limiter.truncated).toBe(false);
  });
});
