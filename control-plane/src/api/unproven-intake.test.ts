import { describe, expect, it } from "vitest";
import { useFakeClock } from "../../../test/support/fake-clock.js";
import { createUnprovenIntake, type HeldSession } from "./unproven-intake.js";

/** A connection whose socket handle records whether it is read, and the settings sent on it. */
interface FakeSession extends HeldSession {
  closed: boolean;
  destroyed: boolean;
  readonly handle: { reading: boolean };
  readonly sent: { maxConcurrentStreams: number }[];
}

function session(options: { readonly handle?: boolean } = {}): FakeSession {
  const handle = { reading: true, readStop: () => ((handle.reading = false), 0) };
  const onClose: (() => void)[] = [];
  const s: FakeSession = {
    closed: false,
    destroyed: false,
    socket: options.handle === false ? {} : { _handle: handle },
    handle,
    sent: [] as { maxConcurrentStreams: number }[],
    settings(settings: { maxConcurrentStreams: number }) {
      s.sent.push(settings);
    },
    destroy() {
      s.destroyed = true;
      for (const listener of onClose) listener();
    },
    once(_event: "close", listener: () => void) {
      onClose.push(listener);
      return s;
    },
  };
  return s;
}

describe("unproven intake", () => {
  const { now: clock, advance } = useFakeClock();
  const options = (perSecond: number, burst: number, maxHeld: number) => ({ perSecond, burst, maxHeld, holdMs: 1_000 });

  it("holds a refused connection only past the budget: unread and told to open no streams", () => {
    const dropped: HeldSession[] = [];
    const intake = createUnprovenIntake(options(10, 2, 10), (s) => dropped.push(s), clock);
    const a = session();
    intake.refused(a);
    intake.refused(a);
    expect(a.handle.reading).toBe(true);
    expect(intake.holds(a)).toBe(false);
    intake.refused(a);
    expect(a.handle.reading).toBe(false);
    expect(a.sent).toEqual([{ maxConcurrentStreams: 0 }]);
    expect(intake.holds(a)).toBe(true);
    expect(intake.held).toBe(1);
    expect(dropped).toEqual([a]);
    // The budget refills: a tenth of a second is one refusal more.
    advance(100);
    const b = session();
    intake.refused(b);
    expect(b.handle.reading).toBe(true);
    intake.refused(b);
    expect(b.handle.reading).toBe(false);
  });

  it("never holds a connection that made an authorized call", () => {
    const intake = createUnprovenIntake(options(1, 1, 10), () => {}, clock);
    const known = session();
    intake.proven(known);
    for (let i = 0; i < 5; i++) intake.refused(known);
    expect(known.handle.reading).toBe(true);
    expect(intake.held).toBe(0);
  });

  it("cuts the oldest held connection to make room, and forgets one that closed", () => {
    const intake = createUnprovenIntake(options(1, 1, 2), () => {}, clock);
    intake.refused(session()); // spends the budget
    const [first, second, third] = [session(), session(), session()];
    for (const s of [first, second, third]) intake.refused(s);
    expect(first.destroyed).toBe(true);
    expect([second.destroyed, third.destroyed]).toEqual([false, false]);
    expect(intake.held).toBe(2);
    second.destroy();
    expect(intake.held).toBe(1);
  });

  it("cuts a connection it cannot stop reading, rather than read it on", () => {
    const intake = createUnprovenIntake(options(1, 1, 2), () => {}, clock);
    intake.refused(session());
    const opaque = session({ handle: false });
    intake.refused(opaque);
    expect(opaque.destroyed).toBe(true);
    expect(intake.held).toBe(0);
  });

  it("cuts a held connection once it has been held for the hold time", () => {
    const intake = createUnprovenIntake(options(1, 1, 10), () => {}, clock);
    intake.refused(session());
    const early = session();
    intake.refused(early);
    advance(500);
    const late = session();
    intake.refused(late);
    advance(600);
    expect([early.destroyed, late.destroyed]).toEqual([true, false]);
    advance(500);
    expect(late.destroyed).toBe(true);
    expect(intake.held).toBe(0);
  });
});
