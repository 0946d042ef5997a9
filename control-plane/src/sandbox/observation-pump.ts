// Carries a command's output from the host stream to the ledger as it arrives: decoded per
// stream, redacted of the run's secrets, chunks that queued up while writes were in flight
// merged into one observation, and nothing past the output cap kept at all.
//
// Throughput: a fast command prints far quicker than the ledger commits, so the pump keeps
// two writes in flight (the next observation is decoded and sent while the ledger commits the
// one before; the ledger numbers them in the order they are sent, so the rows stay in order), merges up to
// MAX_OBSERVATION_BYTES per row, and decodes ASCII (most output) without the UTF-8 decoder. Where
// there is nothing to redact, output that is whole, valid UTF-8 without NUL (most of it) is not
// decoded at all: its bytes go to the ledger as they are (ObservationText), sparing the decode,
// the driver's encode and a string of up to a MiB per observation on the heap.
// Memory: past HIGH_WATER_BYTES queued, backlog() returns a promise that settles once the queue
// is down to LOW_WATER_BYTES; the host stream waits on it, so HTTP/2 flow control slows the
// sandbox host instead of the control plane buffering a whole stream.

import { isAscii, isUtf8 } from "node:buffer";
import { StringDecoder } from "node:string_decoder";
import { createStreamRedactor, storableText, type GrantedSecret, type ObservationText, type StreamRedactor } from "../domain/sandbox.js";
import type { OutputStreamName } from "./host-protocol.js";

/**
 * Queued chunks of one stream are merged up to this size into one observation (and hosts send
 * output in chunks no larger). Just under Node's threshold (EXTERN_APEX, 1,031,913 bytes) past
 * which a decoded buffer becomes an external string: 1 MiB observations were external strings,
 * and their churn drove a full garbage collection every few tens of MiB streamed (over a third
 * of the control plane's CPU on a fast stream); strings this size stay on the V8 heap.
 */
export const MAX_OBSERVATION_BYTES = 1000 * 1024;
/** Observations being written at once. */
const WRITES_IN_FLIGHT = 2;
/** Queued output past which push() asks its caller to wait, and the level at which it may go on. */
export const HIGH_WATER_BYTES = 8 * 1024 * 1024;
const LOW_WATER_BYTES = 2 * 1024 * 1024;

export interface ObservationPump {
  /** Synchronous: queues the chunk (or drops it past the cap); persisting happens behind. */
  push(stream: OutputStreamName, chunk: Uint8Array): void;
  /**
   * A promise when the queue is over its high-water mark, settling once it is down to the low
   * one (or writing failed): whoever feeds the pump should wait for it before pushing more.
   */
  backlog(): Promise<void> | undefined;
  /**
   * Persists what is queued and what the decoders and redactors held back; rethrows a failed
   * write. `cut`: the output was truncated elsewhere (the host's cap, a lost host), so what was
   * held back is treated as cut off like output past this pump's own cap.
   */
  finish(cut?: boolean): Promise<void>;
  /** Output bytes accepted (at most the cap). */
  readonly bytes: number;
  /** Whether output past the cap was dropped here. */
  readonly truncated: boolean;
}

/**
 * UTF-8 to text for one stream, a character split across chunks kept for the next one. Pure
 * ASCII (with nothing held back) is copied as Latin-1: the same text, a one-byte string, and
 * several times cheaper than a UTF-8 decode.
 */
function createStreamDecoder(): { write(bytes: Buffer): string; end(): string; storableAsIs(bytes: Buffer): boolean } {
  const utf8 = new StringDecoder("utf8");
  /** Bytes the decoder still waits for to finish a character it holds the start of. */
  let need = 0;
  return {
    /**
     * Whether these bytes, with nothing held from before, are text as the ledger stores it: valid
     * UTF-8 that ends on a whole character (so the decoder needs nothing from them) and no NUL.
     */
    storableAsIs(bytes) {
      return need === 0 && (isAscii(bytes) || isUtf8(bytes)) && !bytes.includes(0);
    },
    write(bytes) {
      if (need === 0 && isAscii(bytes)) return bytes.toString("latin1");
      need = stillNeeded(need, bytes);
      return utf8.write(bytes);
    },
    end() {
      need = 0;
      return utf8.end();
    },
  };
}

const isContinuation = (byte: number) => (byte & 0xc0) === 0x80;

/** How many bytes of a character are missing after `bytes`, given how many were missing before. */
export function stillNeeded(before: number, bytes: Uint8Array): number {
  // The last byte that starts something (ASCII or a lead byte), within a character's reach of the end.
  for (let back = 1; back <= Math.min(4, bytes.length); back++) {
    const byte = bytes[bytes.length - back]!;
    if (isContinuation(byte)) continue;
    // Lead bytes as broadly as a decoder may wait on them (never too few: then ASCII that
    // follows would skip the decoder while it still holds bytes).
    const length = (byte & 0xf8) === 0xf0 ? 4 : (byte & 0xf0) === 0xe0 ? 3 : (byte & 0xe0) === 0xc0 ? 2 : 1;
    return Math.max(0, length - back);
  }
  // Only continuation bytes: they go on the character held from before (when there is one).
  return bytes.length < before ? before - bytes.length : 0;
}

export function createObservationPump(options: {
  readonly secrets: readonly GrantedSecret[];
  readonly maxBytes: number;
  readonly sink: (stream: OutputStreamName, text: ObservationText) => Promise<void>;
}): ObservationPump {
  const queue: { stream: OutputStreamName; chunk: Uint8Array }[] = [];
  let queuedBytes = 0;
  const decoders = { stdout: createStreamDecoder(), stderr: createStreamDecoder() };
  const redactors: Record<OutputStreamName, StreamRedactor> = {
    stdout: createStreamRedactor(options.secrets),
    stderr: createStreamRedactor(options.secrets),
  };
  let bytes = 0;
  let truncated = false;
  let failure: Error | undefined;
  const writing = new Set<Promise<void>>();
  /** Callers waiting for the queue to fall to the low-water mark. */
  let waiters: (() => void)[] = [];
  let wakeFinish: (() => void) | undefined;

  const release = () => {
    if (waiters.length === 0 || (queuedBytes > LOW_WATER_BYTES && failure === undefined)) return;
    const ready = waiters;
    waiters = [];
    for (const resolve of ready) resolve();
  };

  /** Starts writing one observation: the text is taken now, so observations keep their order. */
  const write = (stream: OutputStreamName, text: ObservationText, hasNul: boolean) => {
    if (text.length === 0) return;
    let started: Promise<void>;
    try {
      started = options.sink(stream, hasNul && typeof text === "string" ? storableText(text) : text);
    } catch (error) {
      // A sink that throws instead of rejecting fails the same way, never into the host stream.
      started = Promise.reject(error instanceof Error ? error : new Error(String(error)));
    }
    const written = started.then(
      () => undefined,
      (error: unknown) => {
        failure ??= error instanceof Error ? error : new Error(String(error));
        queue.length = 0;
        queuedBytes = 0;
      },
    );
    writing.add(written);
    void written.finally(() => {
      writing.delete(written);
      pump();
      wakeFinish?.();
    });
  };

  /** Takes queued chunks of one stream, up to MAX_OBSERVATION_BYTES, as one buffer. */
  const take = (): { stream: OutputStreamName; data: Buffer } => {
    const stream = queue[0]!.stream;
    const parts: Uint8Array[] = [];
    let size = 0;
    while (queue.length > 0 && queue[0]!.stream === stream && (size === 0 || size + queue[0]!.chunk.byteLength <= MAX_OBSERVATION_BYTES)) {
      const { chunk } = queue.shift()!;
      parts.push(chunk);
      size += chunk.byteLength;
    }
    queuedBytes -= size;
    const only = parts.length === 1 ? parts[0]! : undefined;
    const data = only !== undefined ? Buffer.from(only.buffer, only.byteOffset, only.byteLength) : Buffer.concat(parts, size);
    return { stream, data };
  };

  const pump = (): void => {
    while (failure === undefined && writing.size < WRITES_IN_FLIGHT && queue.length > 0) {
      const { stream, data } = take();
      if (redactors[stream].passesThrough && decoders[stream].storableAsIs(data)) write(stream, data, false);
      // Redaction markers hold no NUL, so text without a NUL byte needs no stand-ins.
      else write(stream, redactors[stream].push(decoders[stream].write(data)), data.includes(0));
    }
    release();
  };

  return {
    push(stream, chunk) {
      if (failure !== undefined) return;
      const room = options.maxBytes - bytes;
      if (room <= 0) {
        if (chunk.byteLength > 0) truncated = true;
        return;
      }
      const kept = chunk.byteLength > room ? chunk.subarray(0, room) : chunk;
      if (kept !== chunk) truncated = true;
      if (kept.byteLength === 0) return;
      bytes += kept.byteLength;
      queue.push({ stream, chunk: kept });
      queuedBytes += kept.byteLength;
      pump();
    },
    backlog() {
      if (queuedBytes < HIGH_WATER_BYTES || failure !== undefined) return undefined;
      return new Promise<void>((resolve) => waiters.push(resolve));
    },
    async finish(cut = false) {
      for (;;) {
        pump();
        // Nothing in flight means nothing left to write: pump() takes the whole queue unless
        // writes are in flight (or a write failed, which empties it).
        if (writing.size === 0) break;
        await new Promise<void>((resolve) => (wakeFinish = resolve));
        wakeFinish = undefined;
      }
      if (failure === undefined) {
        // Past a cap nothing more of either stream is seen: a secret whose start was held back
        // would be kept as a fragment (and its rest may show elsewhere, e.g. the host's tail).
        const cutOff = cut || truncated;
        for (const stream of ["stdout", "stderr"] as const) {
          const rest = redactors[stream].push(decoders[stream].end()) + redactors[stream].flush(cutOff);
          write(stream, rest, rest.includes("\0"));
        }
        await Promise.all(writing);
      }
      release();
      if (failure !== undefined) throw failure;
    },
    get bytes() {
      return bytes;
    },
    get truncated() {
      return truncated;
    },
  };
}
