// Garbage-collector headroom for the processes that stream command output (the control plane
// and the sandbox agent): without it V8 runs a full collection every few MiB of a stream, because
// the stream's short-lived buffers count against the old generation's limit (docs/architecture.md,
// "Streaming and memory"). The cost is a heap up to four times what survives a collection.

import { setFlagsFromString } from "node:v8";

/** The old generation may grow to (1 + this / 100) times what survived the last full collection. */
export const HEAP_GROWING_PERCENT = 300;

/** Call once at process start, in a process that streams command output (not needed for short CLI commands). */
export function allowHeapGrowthForStreaming(): void {
  // V8 reads this flag each time it sets a limit, so setting it at run time takes effect.
  setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
}
