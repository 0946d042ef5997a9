// A server stream whose messages skip connect's per-message pipeline. Connect passes each message
// of a stream through a chain of async-iterable stages (the interceptors' wrappers, serialize,
// envelope, compress, join, the adapter's write), several promises and their garbage each. For
// Subscribe, where one emission goes to every stream of its connector, that was most of a
// delivery's CPU. Here the handler writes each message's frame, encoded once for all the streams
// that carry it, straight to the HTTP/2 stream, while connect still does everything else: the
// request, auth, the interceptors, errors, the response headers, and the end of the stream with
// its status. Binary codecs only: a data frame (flag byte, big-endian length, message) is the same
// in gRPC, gRPC-Web and Connect, and an uncompressed frame is valid whatever encoding the
// response announced.
import type { Writable } from "node:stream";
import { createContextKey, createContextValues, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerRequest, UniversalServerResponse } from "@connectrpc/connect/protocol";

export interface FrameSink {
  /** Sends one data frame (see dataFrame); a promise while the client is too far behind for more. */
  write(frame: Uint8Array): Promise<void> | undefined;
}

/** The content types whose messages are protobuf binary: gRPC, gRPC-Web and Connect streaming. */
const BINARY_STREAM = /^application\/(?:grpc(?:-web)?(?:\+proto)?|connect\+proto)\s*(?:;|$)/i;

/** Bytes waiting unsent on one stream before its writer must wait. */
const DEFAULT_MAX_QUEUED_BYTES = 1024 * 1024;

/** A stream's frames between the handler that writes them and the response that sends them. */
interface Channel {
  attach(context: HandlerContext): FrameSink;
  /** The first frame's arrival, with the response headers the handler's context holds. */
  readonly opened: Promise<Headers>;
  readonly written: boolean;
  /** What the response sends: the first frames (with them connect sends the headers), then nothing until end(). */
  frames(): AsyncGenerator<Uint8Array>;
  end(): void;
}

const CHANNEL = createContextKey<Channel | undefined>(undefined, { description: "keel.direct-frames" });
const WIRE = createContextKey<Writable | undefined>(undefined, { description: "keel.direct-frames.wire" });

/** The call's HTTP/2 stream, for directFrames to write to once connect has sent the headers. */
export function withWire(wire: Writable | undefined): ContextValues {
  const values = createContextValues();
  if (wire !== undefined) values.set(WIRE, wire);
  return values;
}

/** The sink of a call served by directFrames, or undefined: then yield messages as usual. */
export function frameSinkOf(context: HandlerContext): FrameSink | undefined {
  return context.values.get(CHANNEL)?.attach(context);
}

/** A message as a data frame: not compressed, its length big-endian, its bytes. */
export function dataFrame(message: Uint8Array): Uint8Array {
  const frame = Buffer.allocUnsafe(5 + message.length);
  frame[0] = 0;
  frame.writeUInt32BE(message.length, 1);
  frame.set(message, 5);
  return frame;
}

function createChannel(maxQueuedBytes: number, wire: Writable | undefined): Channel {
  let queue: Uint8Array[] = [];
  let queuedBytes = 0;
  let ended = false;
  let written = false;
  /** Connect has sent the headers and the first frames: the rest go to the wire directly. */
  let live = false;
  let header: Headers | undefined;
  let open: (header: Headers) => void = () => {};
  const opened = new Promise<Headers>((resolve) => (open = resolve));
  let wake: (() => void) | undefined;
  let drained: { promise: Promise<void>; resolve: () => void } | undefined;
  const release = () => {
    const waiting = drained;
    drained = undefined;
    waiting?.resolve();
  };
  const rouse = () => {
    const waiting = wake;
    wake = undefined;
    waiting?.();
  };
  const behind = (): Promise<void> => {
    if (drained === undefined) {
      let resolve = () => {};
      const promise = new Promise<void>((r) => (resolve = r));
      drained = { promise, resolve };
      if (live) wire?.once("drain", release);
    }
    return drained.promise;
  };
  const sink: FrameSink = {
    write(frame) {
      if (ended) return undefined;
      if (live && wire !== undefined) {
        // A closed stream takes no more; the call's signal ends the handler.
        if (wire.destroyed || wire.writableEnded) return undefined;
        wire.write(frame);
        return wire.writableLength > maxQueuedBytes ? behind() : undefined;
      }
      queue.push(frame);
      queuedBytes += frame.length;
      if (!written) {
        written = true;
        open(header ?? new Headers());
      }
      rouse();
      return queuedBytes > maxQueuedBytes ? behind() : undefined;
    },
  };
  return {
    attach(context) {
      header ??= context.responseHeader;
      return sink;
    },
    opened,
    get written() {
      return written;
    },
    async *frames() {
      /** The queued frames as one chunk: those that queued while a write was in flight go out together. */
      const takeQueued = (): Uint8Array => {
        const chunk = queue.length === 1 ? (queue[0] as Uint8Array) : Buffer.concat(queue, queuedBytes);
        queue = [];
        queuedBytes = 0;
        release();
        return chunk;
      };
      for (;;) {
        if (queue.length > 0 && !live) {
          yield takeQueued();
          // Connect has written the headers and that chunk, and waits for the next: from here on
          // frames go straight to the stream, behind what connect wrote (and what queued meanwhile).
          if (wire !== undefined && !ended) {
            live = true;
            if (queue.length > 0) {
              const chunk = takeQueued();
              if (!wire.destroyed) wire.write(chunk);
            }
          }
        } else if (ended) return;
        else await new Promise<void>((resolve) => (wake = resolve));
      }
    },
    end() {
      ended = true;
      release();
      rouse();
    },
  };
}

/**
 * Serves `handler`'s binary calls with direct frames: its implementation finds a FrameSink in its
 * context (frameSinkOf) and writes frames there instead of yielding messages. JSON calls, and an
 * implementation that writes no frame, are served by connect as before.
 */
export function directFrames(handler: UniversalHandler, maxQueuedBytes = DEFAULT_MAX_QUEUED_BYTES): UniversalHandler {
  const serve = async (request: UniversalServerRequest): Promise<UniversalServerResponse> => {
    if (!BINARY_STREAM.test(request.header.get("content-type") ?? "")) return handler(request);
    // Aborted when the client leaves, or when sending stops early (a write failed): the handler stops then.
    const stop = new AbortController();
    const left = () => stop.abort(request.signal.reason);
    if (request.signal.aborted) left();
    else request.signal.addEventListener("abort", left, { once: true });
    const contextValues = request.contextValues ?? createContextValues();
    const channel = createChannel(maxQueuedBytes, contextValues.get(WIRE));
    stop.signal.addEventListener("abort", () => channel.end(), { once: true });
    contextValues.set(CHANNEL, channel);
    // Connect's own response settles once the implementation is done: its status, and for Connect
    // and gRPC-Web the end-of-stream message in its body.
    const settled = handler({ ...request, signal: stop.signal, contextValues });
    const done = () => {
      channel.end();
      request.signal.removeEventListener("abort", left);
    };
    settled.then(done, done);
    const header = await Promise.race([channel.opened, settled.then(() => undefined)]);
    if (header === undefined && !channel.written) return settled;
    let final: UniversalServerResponse | undefined;
    async function* body(): AsyncGenerator<Uint8Array> {
      let sent = false;
      try {
        yield* channel.frames();
        final = await settled;
        if (final.body !== undefined) yield* final.body;
        sent = true;
      } finally {
        if (!sent) stop.abort();
      }
    }
    const response = {
      status: 200,
      header: header ?? (await channel.opened),
      body: body(),
      // Read once the body is done: by then connect has set the call's status (gRPC sends it here;
      // Connect and gRPC-Web in the body, and have none).
      get trailer() {
        return final?.trailer;
      },
    };
    return response as UniversalServerResponse;
  };
  return Object.assign(serve, {
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
    supportedContentType: handler.supportedContentType,
    requestPath: handler.requestPath,
    service: handler.service,
    method: handler.method,
  });
}
