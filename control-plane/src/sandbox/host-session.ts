// One attached host's session in the hub: its Attach stream's command queue, when it was last
// heard from, and the hold that stops reading its stream while an output consumer is behind.
import type { HostCommand, HostRegistration } from "./host-protocol.js";

/**
 * Longest a consumer that is behind (the ledger, for a fast stream) holds a host's stream at a
 * time. Bounded, so a stuck consumer cannot silence every other command of that host for good;
 * past it the output is queued in memory again.
 */
const MAX_HOLD_MS = 5_000;

export class HostSession {
  private readonly queue: HostCommand[] = [];
  private wake: (() => void) | undefined;
  closed = false;
  lastSeenAt = Date.now();
  /** Whether its stream is held (not read) for a consumer that is behind: its silence is ours, not the host's. */
  held = false;
  /** What the last output's consumer asked the stream to wait for. */
  backlog: Promise<void> | undefined;

  constructor(
    readonly registration: HostRegistration,
    private readonly onClose: (session: HostSession, reason: string) => void,
  ) {}

  push(command: HostCommand): void {
    if (this.closed) return;
    this.queue.push(command);
    this.wake?.();
  }

  close(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.wake?.();
    this.onClose(this, reason);
  }

  async *commands(): AsyncGenerator<HostCommand> {
    try {
      while (!this.closed) {
        const next = this.queue.shift();
        if (next !== undefined) {
          yield next;
          continue;
        }
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
      }
    } finally {
      this.close("the command stream was closed");
    }
  }

  /** After a message was received: a promise when the stream should not be read further until it settles. */
  holdOff(): Promise<void> | undefined {
    const backlog = this.backlog;
    this.backlog = undefined;
    return backlog === undefined ? undefined : this.hold(backlog);
  }

  private async hold(until: Promise<void>): Promise<void> {
    this.held = true;
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([until, new Promise<void>((resolve) => (timer = setTimeout(resolve, MAX_HOLD_MS)))]);
    } finally {
      clearTimeout(timer);
      this.held = false;
      this.lastSeenAt = Date.now();
    }
  }
}
