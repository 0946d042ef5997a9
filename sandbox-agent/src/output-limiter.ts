// Output limiting for an exec: both backends forward a command's output through one of these,
// so maxOutputBytes means the same on each.
import type { OutputStreamName } from "./workspace-backend.js";

export interface OutputLimiter {
  write(stream: OutputStreamName, chunk: Uint8Array): void;
  readonly truncated: boolean;
  readonly forwardedBytes: number;
}

export function createOutputLimiter(maxBytes: number, onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void): OutputLimiter {
  let forwarded = 0;
  let truncated = false;
  return {
    write(stream, chunk) {
      if (chunk.length === 0) return;
      const room = Math.max(0, maxBytes - forwarded);
      if (chunk.length > room) truncated = true;
      if (room === 0) return;
      const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
      forwarded += part.length;
      onOutput(stream, part);
    },
    get truncated() {
      return truncated;
    },
    get forwardedBytes() {
      return forwarded;
    },
  };
}
