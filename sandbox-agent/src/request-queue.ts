// The Attach request stream of one connection: pushed to by the agent, pulled by the transport.
// It counts the output bytes the transport has not taken yet, so execs can stop reading their
// commands' output while the transport is behind.
import type { AttachRequest } from "../../gen/keel/v1/sandbox_service_pb.js";

/**
 * Output queued for the stream past which execs stop reading their commands' output (the
 * transport is behind: HTTP/2 flow control, a control plane whose ledger is behind), and the
 * level at which they go on. Keeps this process's memory bounded on a fast stream.
 */
const OUTPUT_HIGH_WATER_BYTES = 8 * 1024 * 1024;
const OUTPUT_LOW_WATER_BYTES = 2 * 1024 * 1024;

/** A request stream fed by pushes; what the transport has not taken yet can be taken back. */
export class RequestQueue implements AsyncIterable<AttachRequest> {
  private readonly items: AttachRequest[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  /** Output bytes queued and not yet taken by the transport. */
  private outputBytes = 0;
  private waiters: (() => void)[] = [];

  /** @param hungry Called when the transport wants a message and none is queued: a chance to send output held back. */
  constructor(private readonly hungry: () => void) {}

  /** Whether the transport is waiting for a message (it took everything and wrote it). */
  get waiting(): boolean {
    return this.wake !== undefined;
  }

  push(item: AttachRequest): void {
    if (this.ended) return;
    this.items.push(item);
    this.outputBytes += outputBytesOf(item);
    this.wake?.();
  }

  /** Ends the stream and returns what was never handed to the transport. */
  end(): AttachRequest[] {
    this.ended = true;
    this.wake?.();
    this.outputBytes = 0;
    this.release();
    return this.items.splice(0);
  }

  /** A promise while too much output waits for the transport, settling once enough was taken. */
  backlog(): Promise<void> | undefined {
    if (this.ended || this.outputBytes < OUTPUT_HIGH_WATER_BYTES) return undefined;
    return new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  private release(): void {
    if (this.outputBytes > OUTPUT_LOW_WATER_BYTES) return;
    for (const resolve of this.waiters.splice(0)) resolve();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<AttachRequest> {
    while (!this.ended) {
      if (this.items.length === 0) this.hungry();
      const next = this.items.shift();
      if (next !== undefined) {
        this.outputBytes -= outputBytesOf(next);
        this.release();
        yield next;
        continue;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

const outputBytesOf = (request: AttachRequest): number => (request.message.case === "output" ? request.message.value.chunk.byteLength : 0);
