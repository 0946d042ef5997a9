// Answers to HTTP/2 calls refused for want of a valid token, at a bounded rate for the process.
// A client that floods such calls in a closed loop (the next upload sent as soon as the last one
// is refused) takes as much of the event loop as the server gives it, and authorized calls wait
// behind its refusals. Past the rate, a refused stream waits unanswered for its turn: the
// flooder's next call waits with it, and an unanswered stream can push no more than its first
// flow-control window. The wait is bounded in streams; past that a stream is reset at once with
// REFUSED_STREAM, which costs less than an answer and tells a real client it may retry.
import http2 from "node:http2";
import { createTokenBucket } from "./token-bucket.js";

/** What the pacer needs of a stream: whether it is still open, and a way to reset it. */
export interface PacedStream {
  readonly closed: boolean;
  readonly destroyed: boolean;
  close(code: number): void;
}

export interface RefusalPacerOptions {
  /** Refusals answered per second, on average. */
  readonly perSecond: number;
  /** Refusals answered at once after a quiet spell. */
  readonly burst: number;
  /** Refused streams waiting for their answer at most; more are reset with REFUSED_STREAM. */
  readonly maxHeld: number;
}

/** The pace for `perSecond` answers a second: a tenth of a second's worth at once, two seconds' worth waiting at most. */
export function refusalPace(perSecond: number): RefusalPacerOptions {
  return { perSecond, burst: Math.max(1, Math.ceil(perSecond / 10)), maxHeld: Math.max(100, perSecond * 2) };
}

export const DEFAULT_REFUSAL_PACE = refusalPace(1_000);

/** How often waiting refusals are looked at. */
const TICK_MS = 10;

export interface RefusalPacer {
  /**
   * Calls `answer` now if the rate allows, else once it does (unless the stream closed meanwhile).
   * `group` (the stream's connection) lets `flush` find it.
   */
  answer(stream: PacedStream, answer: () => void, group?: object): void;
  /** Answers at once, whatever the rate, every refusal of `group` still waiting. */
  flush(group: object): void;
  /** Forgets every refusal of `group` still waiting, unanswered (its streams stay as they are). */
  drop(group: object): void;
  /** Refusals waiting now. */
  readonly held: number;
}

export function createRefusalPacer(options: RefusalPacerOptions = DEFAULT_REFUSAL_PACE, clock: () => number = () => performance.now()): RefusalPacer {
  const tokens = createTokenBucket(options.perSecond, options.burst, clock);
  // A FIFO as an array and a head index; entries whose stream closed are skipped without a token.
  let waiting: { readonly stream: PacedStream; readonly answer: () => void; readonly group: object | undefined }[] = [];
  let head = 0;
  // Runs only while something waits, and never holds the process open.
  let timer: NodeJS.Timeout | undefined;
  const open = (stream: PacedStream) => !stream.closed && !stream.destroyed;

  const schedule = () => {
    if (timer === undefined && head < waiting.length) timer = setTimeout(drain, TICK_MS).unref();
  };
  function drain(): void {
    timer = undefined;
    while (head < waiting.length) {
      const { stream, answer } = waiting[head]!;
      if (open(stream)) {
        if (!tokens.take()) break;
        answer();
      }
      head++;
    }
    if (head === waiting.length) {
      waiting = [];
      head = 0;
    }
    schedule();
  }

  /** Takes `group`'s waiting refusals out of the queue, answering them if `answer`. */
  const remove = (group: object, answer: boolean) => {
    const rest: typeof waiting = [];
    for (let i = head; i < waiting.length; i++) {
      const entry = waiting[i]!;
      if (entry.group !== group) rest.push(entry);
      else if (answer && open(entry.stream)) entry.answer();
    }
    waiting = rest;
    head = 0;
  };

  return {
    answer(stream, answer, group) {
      if (head === waiting.length && tokens.take()) {
        answer();
        return;
      }
      if (waiting.length - head >= options.maxHeld) {
        // Full: streams that closed while they waited go first, then the newcomer if still full.
        waiting = waiting.slice(head).filter((entry) => open(entry.stream));
        head = 0;
        if (waiting.length >= options.maxHeld) {
          if (open(stream)) stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
          return;
        }
      }
      waiting.push({ stream, answer, group });
      schedule();
    },
    flush(group) {
      remove(group, true);
    },
    drop(group) {
      remove(group, false);
    },
    get held() {
      return waiting.length - head;
    },
  };
}
