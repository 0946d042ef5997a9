import { describe, expect, it } from "vitest";
import { useFakeClock } from "../../../test/support/fake-clock.js";
import { createUnprovenIntake, type HeldSession, type NewConnection } from "./unproven-intake.js";

/** A connection whose socket handle records whether it is read, and the settings sent on it. */
interface FakeSession extends HeldSession {
  closed: boolean;
  destroyed: boolean;
  readonly handle: { reading: boolean };
  readonly sent: { maxConcurrentStreams: number }[];
}

function session(options: { readonly handle?: boolean; readonly address?: string } = {}): FakeSession {
  const handle = { reading: true, readStop: () => ((handle.reading = false), 0) };
  const onClose: (() => void)[] = [];
  const s: FakeSession = {
    closed: false,
    destroyed: false,
    socket: options.handle === false ? {} : { _handle: handle, remoteAddress: options.address ?? "10.0.0.1" },
    handle,
    sent: [] as { maxConcurrentStreams: number }[],
    settings(settings: { maxConcurrentStreams: number }) {
      s.sent.push(settings);
    },
    destroy() {
      s.destroyed = true;
      // As Node's does, a destroyed session lets go of its socket (and with it its address).
      (s as { socket: unknown }).socket = undefined;
      for (const listener of onClose) listener();
    },
    once(_event: "close", listener: () => void) {
      onClose.push(listener);
      return s;
    },
  };
  return s;
}

/** A new connection's socket that records whether it is read and whether it was cut. */
interface FakeConnection extends NewConnection {
  destroyed: boolean;
  readonly handle: { reading: boolean };
  readonly errorListeners: number;
}

function connection(address: string): FakeConnection {
  const handle = { reading: true, readStop: () => ((handle.reading = false), 0) };
  const onClose: (() => void)[] = [];
  let errorListeners = 0;
  const c = {
    remoteAddress: address,
    _handle: handle,
    handle,
    destroyed: false,
    get errorListeners() {
      return errorListeners;
    },
    destroy() {
      c.destroyed = true;
      for (const listener of onClose) listener();
    },
    once(_event: "close", listener: () => void) {
      onClose.push(listener);
      return c;
    },
    on(_event: "error") {
      errorListeners++;
      return c;
    },
  };
  return c;
}

describe("unproven intake", () => {
  const { now: clock, advance } = useFakeClock();
  const options = (perSecond: number, burst: number, maxHeld: number, park: { after?: number; max?: number } = {}) => ({
    perSecond,
    burst,
    maxHeld,
    holdMs: 1_000,
    parkAfterHeld: park.after ?? 100,
    maxParked: park.max ?? 100,
  });

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

  it("parks new connections from an address with enough connections held, and only from it", () => {
    const intake = createUnprovenIntake(options(1, 1, 10, { after: 2, max: 10 }), () => {}, clock);
    intake.refused(session()); // spends the budget
    const first = connection("10.0.0.1");
    expect(intake.admit(first)).toBe(true);
    const [a, b] = [session(), session()];
    intake.refused(a);
    expect(intake.admit(connection("10.0.0.1"))).toBe(true); // one held: still read
    intake.refused(b);
    const parked = connection("10.0.0.1");
    expect(intake.admit(parked)).toBe(false);
    expect(parked.handle.reading).toBe(false);
    expect(parked.errorListeners).toBe(1);
    expect(intake.parked).toBe(1);
    // Another address is read as ever.
    const other = connection("10.0.0.2");
    expect(intake.admit(other)).toBe(true);
    expect(other.handle.reading).toBe(true);
    // Once a held connection from the address closes, its new connections are read again.
    a.destroy();
    expect(intake.admit(connection("10.0.0.1"))).toBe(true);
  });

  it("cuts the oldest parked connection to make room, and every parked one after the hold time", () => {
    const intake = createUnprovenIntake(options(1, 1, 10, { after: 1, max: 2 }), () => {}, clock);
    intake.refused(session());
    intake.refused(session());
    const [first, second] = [connection("10.0.0.1"), connection("10.0.0.1")];
    intake.admit(first);
    advance(500);
    intake.admit(second);
    advance(300);
    const third = connection("10.0.0.1");
    intake.admit(third);
    expect([first.destroyed, second.destroyed, third.destroyed]).toEqual([true, false, false]);
    expect(intake.parked).toBe(2);
    advance(800); // the second has been parked 1.1 s, the third 0.8 s
    expect([second.destroyed, third.destroyed]).toEqual([true, false]);
    advance(300);
    expect(third.destroyed).toBe(true);
    expect(intake.parked).toBe(0);
  });
});
