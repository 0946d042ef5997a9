// A clock for unit tests of code that takes `clock: () => number` and also sets timers: vitest's
// fake timers and the clock move together. Call inside a describe block; it installs its hooks.
import { afterEach, beforeEach, vi } from "vitest";

export interface FakeClock {
  /** Milliseconds, as performance.now. */
  readonly now: () => number;
  /** Moves the clock and runs the timers that came due. */
  readonly advance: (ms: number) => void;
  /** Moves the clock alone, as time passing before a timer gets to run. */
  readonly move: (ms: number) => void;
}

export function useFakeClock(): FakeClock {
  let now = 0;
  beforeEach(() => {
    now = 0;
    vi.useFakeTimers();
  });
  afterEach(() => vi.useRealTimers());
  return {
    now: () => now,
    advance: (ms) => {
      now += ms;
      vi.advanceTimersByTime(ms);
    },
    move: (ms) => {
      now += ms;
    },
  };
}
