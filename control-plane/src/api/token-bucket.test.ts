import { describe, expect, it } from "vitest";
import { createTokenBucket } from "./token-bucket.js";

describe("token bucket", () => {
  it("gives its burst at once, then refills at its rate up to the burst", () => {
    let now = 0;
    const bucket = createTokenBucket(10, 3, () => now);
    expect([bucket.take(), bucket.take(), bucket.take(), bucket.take()]).toEqual([true, true, true, false]);
    now += 150; // 1.5 tokens
    expect(bucket.available()).toBeCloseTo(1.5);
    expect([bucket.take(), bucket.take()]).toEqual([true, false]);
    now += 10_000;
    expect(bucket.available()).toBe(3);
  });
});
