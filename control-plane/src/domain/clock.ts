// Time as a port. Coalescing windows, admission and the starvation bound read the clock
// through this, so a test can hold time still and step it.

export interface Clock {
  now(): Date;
}

export const systemClock: Clock = { now: () => new Date() };
