// Docker's attach stream multiplexes stdout and stderr in frames; this splits it without
// copying the payloads.
import type { OutputStreamName } from "../workspace-backend.js";

/** Parses Docker's multiplexed attach stream: [type, 0, 0, 0, size(4, big-endian)] + payload. */
export function createDemuxer(emit: (stream: OutputStreamName, chunk: Uint8Array) => void): (chunk: Buffer) => void {
  const header = Buffer.alloc(8);
  let headerBytes = 0;
  let remaining = 0;
  let stream: OutputStreamName = "stdout";
  return (chunk) => {
    let offset = 0;
    while (offset < chunk.length) {
      if (remaining === 0) {
        const n = Math.min(8 - headerBytes, chunk.length - offset);
        chunk.copy(header, headerBytes, offset, offset + n);
        headerBytes += n;
        offset += n;
        if (headerBytes === 8) {
          // 0 (stdin, written on stdout) and 1: stdout; 2 (and 3, the engine's own errors): stderr.
          stream = header[0] === 0 || header[0] === 1 ? "stdout" : "stderr";
          remaining = header.readUInt32BE(4);
          headerBytes = 0;
        }
        continue;
      }
      const n = Math.min(remaining, chunk.length - offset);
      emit(stream, chunk.subarray(offset, offset + n));
      offset += n;
      remaining -= n;
    }
  };
}
