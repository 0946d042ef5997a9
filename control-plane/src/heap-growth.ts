// Garbage-collector headroom for the long-running processes that stream command output (the
// control plane and the sandbox agent).
//
// Node 20's V8 counts ArrayBuffer memory allocated since the last full collection against the
// old generation's limit, and sets that limit at a small multiple of the JavaScript heap (1.1 to
// 4 times, lower after its memory reducer ran while the process idled). A fast stream allocates
// several MiB of short-lived buffers per MiB of output (socket reads, protobuf and gRPC framing,
// the database driver's messages) over a 20-50 MiB heap, while the young-generation collection
// that frees them runs only every 32 MiB of such buffers: the limit was crossed every few MiB, and
// a full collection ran every 50-150 ms of a stream (sandbox bench: a third to half of both
// processes' CPU; none in a process's first seconds, when V8 holds back, which is why short runs
// looked fast). A fixed growing factor at the top of V8's own range leaves the young collection
// room to free the buffers first.
//
// The cost is memory: the heap may grow to four times what survives a full collection before the
// next one (V8 allows itself the same on a machine with plenty of memory).

import { setFlagsFromString } from "node:v8";

/** The old generation may grow to (1 + this / 100) times what survived the last full collection. */
export const HEAP_GROWING_PERCENT = 300;

/** Call once at process start, in a process that streams command output (not needed for short CLI commands). */
export function allowHeapGrowthForStreaming(): void {
  // V8 reads this flag each time it sets a limit, so setting it at run time takes effect.
  setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
}
