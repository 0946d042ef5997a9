// A clock that moves only when a test moves it, so coalesce windows and interrupt ceilings
// are exact: "four messages inside two seconds" means exactly that, however slow the machine.
import type { Clock } from "../../control-plane/src/domain/clock.js";

export class ManualClock implements Clock {
  private at: number;

  constructor(start: Date = new Date()) {
    this.at = start.getTime();
  }

  now(): Date {
    return new Date(this.at);
  }

  advance(ms: number): void {
    this.at += ms;
  }
}
