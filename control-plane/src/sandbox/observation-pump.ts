// Carries a command's output from the host stream to the ledger as it arrives: decoded per
// stream, redacted of the run's secrets, chunks that queued up while a write was in flight
// merged into one observation, and nothing past the output cap kept at all.

import { TextDecoder } from "node:util";
import { createStreamRedactor, storableText, type GrantedSecret, type StreamRedactor } from "../domain/sandbox.js";
import type { OutputStreamName } from "./host-protocol.js";

/** Queued chunks of one stream are merged up to this size into one observation. */
const MAX_OBSERVATION_BYTES = 256 * 1024;

export interface ObservationPump {
  /** Synchronous: queues the chunk (or drops it past the cap); persisting happens behind. */
  push(stream: OutputStreamName, chunk: Uint8Array): void;
  /** Persists what is queued and what the decoders and redactors held back; rethrows a failed write. */
  finish(): Promise<void>;
  /** Output bytes accepted (at most the cap). */
  readonly bytes: number;
  /** Whether output past the cap was dropped here. */
  readonly truncated: boolean;
}

export function createObservationPump(options: {
  readonly secrets: readonly GrantedSecret[];
  readonly maxBytes: number;
  readonly sink: (stream: OutputStreamName, text: string) => Promise<void>;
}): ObservationPump {
  const queue: { stream: OutputStreamName; chunk: Uint8Array }[] = [];
  const decoders: Record<OutputStreamName, TextDecoder> = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  const redactors: Record<OutputStreamName, StreamRedactor> = {
    stdout: createStreamRedactor(options.secrets),
    stderr: createStreamRedactor(options.secrets),
  };
  let bytes = 0;
  let truncated = false;
  let failure: unknown;
  let draining: Promise<void> | undefined;

  const emit = async (stream: OutputStreamName, text: string) => {
    if (text !== "") await options.sink(stream, storableText(text));
  };

  const drain = async () => {
    while (queue.length > 0 && failure === undefined) {
      const stream = queue[0]!.stream;
      const parts: Uint8Array[] = [];
      let size = 0;
      while (queue.length > 0 && queue[0]!.stream === stream && size < MAX_OBSERVATION_BYTES) {
        const { chunk } = queue.shift()!;
        parts.push(chunk);
        size += chunk.byteLength;
      }
      const text = decoders[stream].decode(Buffer.concat(parts), { stream: true });
      try {
        await emit(stream, redactors[stream].push(text));
      } catch (error) {
        failure = error;
      }
    }
    queue.length = 0;
  };

  const kick = (): void => {
    if (draining !== undefined) return;
    draining = drain().finally(() => {
      draining = undefined;
      if (queue.length > 0) kick();
    });
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
      bytes += kept.byteLength;
      queue.push({ stream, chunk: kept });
      kick();
    },
    async finish() {
      while (draining !== undefined || queue.length > 0) {
        kick();
        await draining;
      }
      if (failure === undefined) {
        for (const stream of ["stdout", "stderr"] as const) {
          const rest = redactors[stream].push(decoders[stream].decode()) + redactors[stream].flush();
          await emit(stream, rest);
        }
      }
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
