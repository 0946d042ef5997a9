// An exec's output on its way to the control plane: merged into few, large messages while the
// transport is busy, sent at once when it is idle.
//
// Each message has a fixed cost on both sides (encoding, framing, decoding, a ledger row), so
// output is coalesced up to the chunk size the control plane announced. HTTP/2 flow control
// paces the transport; when it asks for the next message, every batcher holding output flushes
// (the agent's request queue calls back). An idle transport gets output after the current turn
// of the event loop, so a burst goes out as one message and a small command's output is not
// held back. A fast producer (BURST_BYTES or more in a turn) lingers up to LINGER_MS for more,
// so an idle transport does not take a fast stream one socket read at a time.

import type { OutputStreamName } from "./workspace-backend.js";

/** The last bytes of each exec's output, returned with its result. */
export const TAIL_BYTES = 4 * 1024;
/** Held output at least this large when it could be sent means a fast producer: it lingers. */
export const BURST_BYTES = 32 * 1024;
/** How long a fast producer's output may linger for more before it goes out anyway. */
export const LINGER_MS = 4;

export interface OutputOutlet {
  /** Sends one message of output; false when it was dropped instead (no connection, buffer full). */
  send(stream: OutputStreamName, chunk: Uint8Array): boolean | void;
  /** The largest chunk one message may carry. */
  readonly maxChunkBytes: number;
  /** Whether the transport is waiting for a message right now. */
  readonly transportWaiting: boolean;
  /** The batcher holds output back: have it flush when the transport next asks for a message. */
  holding(batcher: OutputBatcher): void;
}

/** Merges an exec's output into fewer, larger messages and keeps its tail. */
export class OutputBatcher {
  private stream: OutputStreamName = "stdout";
  private parts: Uint8Array[] = [];
  private size = 0;
  private scheduled: NodeJS.Immediate | undefined;
  private lingering: NodeJS.Timeout | undefined;
  private tail: Buffer = Buffer.alloc(0);
  /** All output pushed so far. */
  bytes = 0;
  /** Some output never left this host (dropped while disconnected): the exec's result must say truncated. */
  lost = false;

  constructor(private readonly outlet: OutputOutlet) {}

  push(stream: OutputStreamName, chunk: Uint8Array): void {
    if (chunk.byteLength === 0) return;
    this.bytes += chunk.byteLength;
    this.tail = chunk.byteLength >= TAIL_BYTES ? Buffer.from(chunk.subarray(chunk.byteLength - TAIL_BYTES)) : Buffer.concat([this.tail, chunk]);
    if (this.tail.byteLength > TAIL_BYTES) this.tail = this.tail.subarray(this.tail.byteLength - TAIL_BYTES);
    if (stream !== this.stream) this.flush();
    this.stream = stream;
    // No message goes past the announced chunk size: a big chunk goes out in slices.
    const max = Math.max(1, this.outlet.maxChunkBytes);
    let offset = 0;
    while (offset < chunk.byteLength) {
      if (this.size >= max) this.flush(); // the control plane announced a smaller size meanwhile
      const part = chunk.subarray(offset, offset + max - this.size);
      offset += part.byteLength;
      this.parts.push(part);
      this.size += part.byteLength;
      if (this.size >= max) this.flush();
    }
    if (this.size === 0) return;
    if (this.outlet.transportWaiting) this.scheduled ??= setImmediate(() => this.ready());
    else this.outlet.holding(this);
  }

  /**
   * The transport can take a message: small output goes now, a fast producer's lingers up to
   * LINGER_MS for more (it goes sooner once it reaches the chunk size).
   */
  ready(): void {
    clearImmediate(this.scheduled);
    this.scheduled = undefined;
    if (this.lingering !== undefined) return;
    if (this.size < BURST_BYTES) {
      this.flush();
      return;
    }
    this.lingering = setTimeout(() => this.flush(), LINGER_MS);
  }

  /** Sends what is held back, if anything. */
  flush(): void {
    clearImmediate(this.scheduled);
    this.scheduled = undefined;
    clearTimeout(this.lingering);
    this.lingering = undefined;
    if (this.size === 0) return;
    const chunk = this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.size);
    this.parts = [];
    this.size = 0;
    if (this.outlet.send(this.stream, chunk) === false) this.lost = true;
  }

  tailBytes(): Uint8Array {
    return new Uint8Array(this.tail);
  }
}
