import http2 from "node:http2";
import { describe, expect, it, vi } from "vitest";
import { useFakeClock } from "../../../test/support/fake-clock.js";
import { createRefusalPacer, type PacedStream } from "./refusal-pacer.js";

/** A stream that records how it was closed. */
function stream(): PacedStream & { closedWith: number | undefined; closed: boolean } {
  const s = {
    closed: false,
    destroyed: false,
    closedWith: undefined as number | undefined,
    close(code: number) {
      s.closed = true;
      s.closedWith = code;
    },
  };
  return s;
}

describe("refusal pacer", () => {
  const { now: clock, advance, move } = useFakeClock();

  it("answers a burst at once, then at the rate, in arrival order", () => {
    const pacer = createRefusalPacer({ perSecond: 100, burst: 3, maxHeld: 50 }, clock);
    const answered: number[] = [];
    for (let i = 0; i < 8; i++) pacer.answer(stream(), () => answered.push(i));
    expect(answered).toEqual([0, 1, 2]);
    expect(pacer.held).toBe(5);
    advance(10); // 100/s: one more every 10 ms
    expect(answered).toEqual([0, 1, 2, 3]);
    advance(30);
    expect(answered).toEqual([0, 1, 2, 3, 4, 5, 6]);
    advance(10);
    expect(answered).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(pacer.held).toBe(0);
  });

  it("a newcomer waits behind those already waiting even when a token is free", () => {
    const pacer = createRefusalPacer({ perSecond: 100, burst: 1, maxHeld: 50 }, clock);
    const answered: string[] = [];
    pacer.answer(stream(), () => answered.push("a"));
    pacer.answer(stream(), () => answered.push("b"));
    move(10); // a token accrues, but the timer has not run yet
    pacer.answer(stream(), () => answered.push("c"));
    expect(answered).toEqual(["a"]);
    vi.advanceTimersByTime(10); // the tick: b's turn, and c still waits
    expect(answered).toEqual(["a", "b"]);
    expect(pacer.held).toBe(1);
  });

  it("skips a stream that closed while it waited, without spending its turn", () => {
    const pacer = createRefusalPacer({ perSecond: 100, burst: 1, maxHeld: 50 }, clock);
    const answered: string[] = [];
    pacer.answer(stream(), () => answered.push("first"));
    const gone = stream();
    pacer.answer(gone, () => answered.push("gone"));
    pacer.answer(stream(), () => answered.push("next"));
    gone.closed = true;
    advance(10);
    expect(answered).toEqual(["first", "next"]);
  });

  it("resets a stream with REFUSED_STREAM when the wait is full, after dropping closed ones", () => {
    const pacer = createRefusalPacer({ perSecond: 1, burst: 1, maxHeld: 2 }, clock);
    pacer.answer(stream(), () => {});
    const waiting = [stream(), stream()];
    for (const s of waiting) pacer.answer(s, () => {});
    const over = stream();
    pacer.answer(over, () => {});
    expect(over.closedWith).toBe(http2.constants.NGHTTP2_REFUSED_STREAM);
    expect(pacer.held).toBe(2);
    waiting[0]!.closed = true;
    const fits = stream();
    pacer.answer(fits, () => {});
    expect(fits.closedWith).toBeUndefined();
    expect(pacer.held).toBe(2);
  });

  it("answers a group's waiting refusals at once on flush, leaving the others their turn", () => {
    const pacer = createRefusalPacer({ perSecond: 100, burst: 1, maxHeld: 50 }, clock);
    const [shed, kept] = [{}, {}];
    const answered: string[] = [];
    pacer.answer(stream(), () => answered.push("burst"), kept);
    pacer.answer(stream(), () => answered.push("kept-1"), kept);
    pacer.answer(stream(), () => answered.push("shed-1"), shed);
    const gone = stream();
    pacer.answer(gone, () => answered.push("shed-gone"), shed);
    pacer.answer(stream(), () => answered.push("kept-2"), kept);
    gone.closed = true;
    pacer.flush(shed);
    expect(answered).toEqual(["burst", "shed-1"]);
    expect(pacer.held).toBe(2);
    advance(10);
    advance(10);
    expect(answered).toEqual(["burst", "shed-1", "kept-1", "kept-2"]);
  });

  it("refills to the burst, not past it, after a quiet spell", () => {
    const pacer = createRefusalPacer({ perSecond: 1_000, burst: 5, maxHeld: 50 }, clock);
    move(60_000);
    const answered: number[] = [];
    for (let i = 0; i < 7; i++) pacer.answer(stream(), () => answered.push(i));
    expect(answered).toHaveLength(5);
  });
});
