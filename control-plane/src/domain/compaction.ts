// Mechanical compaction of a run's own tool results before each model call. The loop re-sends the
// whole transcript every turn, so old tool output would otherwise crowd out the context window long
// before any budget fires. This is not a summary: older results are cut down to their first and last
// lines plus a marker that says how much was left out and where the full text lives (the run ledger).
// Only `role: "tool"` messages are ever rewritten; conversation turns are never touched.
//
// Order of decisions, walking tool results from newest to oldest:
//   1. the newest `keepRecent` results stay verbatim;
//   2. older results stay verbatim while the running byte total of those older verbatim results fits
//      in `verbatimByteBudget`; the first one that does not fit ends this phase;
//   3. that result and every older one is replaced by its excerpt, unless the excerpt would not be
//      smaller than the original (or the content already is an excerpt), in which case it is kept.
// The result is deterministic and idempotent: compacting an already compacted transcript changes nothing.
import { byteLength } from "./ids.js";
import type { ModelMessage } from "./transcript.js";

export interface CompactionOptions {
  /** The newest N tool results are always kept verbatim. */
  readonly keepRecent: number;
  /** Older results are kept verbatim while their running byte total fits this budget. */
  readonly verbatimByteBudget: number;
  /** How many first and last lines an excerpt keeps. */
  readonly excerptLines: number;
}

export const DEFAULT_COMPACTION: CompactionOptions = { keepRecent: 3, verbatimByteBudget: 32 * 1024, excerptLines: 3 };

/**
 * Lines kept in an excerpt are clipped to this many characters (ending in "…"), so that output made
 * of a few enormous lines (minified JSON, say) still shrinks.
 */
export const EXCERPT_LINE_MAX_CHARS = 500;

/**
 * Rewrites old tool results into excerpts. `refs` maps a tool call id to the ledger id (tool
 * invocation) the excerpt points at; a call without an entry is pointed at by its tool call id.
 */
export function compactToolResults(
  messages: readonly ModelMessage[],
  refs: Readonly<Record<string, string>>,
  options: CompactionOptions = DEFAULT_COMPACTION,
): ModelMessage[] {
  const keepRecent = wholeAtLeastZero(options.keepRecent);
  const byteBudget = Math.max(0, options.verbatimByteBudget);
  const excerptLines = wholeAtLeastZero(options.excerptLines);

  const out = [...messages];
  let seen = 0;
  let verbatimBytes = 0;
  let budgetOpen = true;

  for (let i = out.length - 1; i >= 0; i--) {
    const message = out[i];
    if (message === undefined || message.role !== "tool") continue;
    seen++;
    if (seen <= keepRecent) continue;

    if (budgetOpen) {
      const size = byteLength(message.content);
      if (verbatimBytes + size <= byteBudget) {
        verbatimBytes += size;
        continue;
      }
      budgetOpen = false;
    }

    const pointer = pointerFor(message.toolCallId, refs);
    const content = compactContent(message.content, pointer, excerptLines);
    if (content !== message.content) out[i] = { ...message, content };
  }
  return out;
}

interface Pointer {
  readonly noun: "tool invocation" | "tool call";
  readonly id: string;
}

function pointerFor(toolCallId: string, refs: Readonly<Record<string, string>>): Pointer {
  const ref = Object.prototype.hasOwnProperty.call(refs, toolCallId) ? refs[toolCallId] : undefined;
  // A line break inside the id would split the marker line; ids never contain one, but stay safe.
  if (ref !== undefined && ref !== "") return { noun: "tool invocation", id: ref.replace(/[\r\n]/g, " ") };
  return { noun: "tool call", id: toolCallId.replace(/[\r\n]/g, " ") };
}

function wholeAtLeastZero(value: number): number {
  return Number.isFinite(value) ? Math.max(0, Math.floor(value)) : 0;
}

/** The excerpt for one result, or the content itself when an excerpt would not help. */
function compactContent(content: string, pointer: Pointer, excerptLines: number): string {
  const lines = content.split("\n");
  if (isExcerpt(lines, pointer, excerptLines)) return content;

  let head: readonly string[];
  let tail: readonly string[];
  if (lines.length > 2 * excerptLines) {
    head = lines.slice(0, excerptLines);
    tail = excerptLines === 0 ? [] : lines.slice(lines.length - excerptLines);
  } else {
    // Too few lines to elide any whole line; only clipping long lines can help.
    const half = Math.ceil(lines.length / 2);
    head = lines.slice(0, half);
    tail = lines.slice(half);
  }
  const elidedLines = lines.length - head.length - tail.length;
  const shownHead = head.map(clipLine);
  const shownTail = tail.map(clipLine);
  const keptBytes = byteLength(keptText(head, shownHead)) + byteLength(keptText(tail, shownTail));
  const elidedBytes = Math.max(0, byteLength(content) - keptBytes);

  const excerpt = [...shownHead, marker(elidedBytes, elidedLines, pointer), ...shownTail].join("\n");
  return byteLength(excerpt) < byteLength(content) ? excerpt : content;
}

function marker(bytes: number, lines: number, pointer: Pointer): string {
  const byteWord = bytes === 1 ? "byte" : "bytes";
  const lineWord = lines === 1 ? "line" : "lines";
  return `[… ${bytes} ${byteWord}, ${lines} ${lineWord} elided; full text in the run ledger as ${pointer.noun} ${pointer.id}]`;
}

const MARKER = /^\[… \d+ bytes?, \d+ lines? elided; full text in the run ledger as tool (?:invocation|call) (.*)\]$/s;

/**
 * True when the lines already have the shape this module produces for this pointer: at most
 * 2·excerptLines + 1 lines, one of them our marker for the same id, every other line within the clip
 * length. Such content is left alone, which makes compaction idempotent.
 */
function isExcerpt(lines: readonly string[], pointer: Pointer, excerptLines: number): boolean {
  if (lines.length > 2 * excerptLines + 1) return false;
  const markerIndex = lines.findIndex(
    (line) => line.length <= 200 + pointer.id.length && MARKER.exec(line)?.[1] === pointer.id,
  );
  if (markerIndex < 0) return false;
  return lines.every((line, index) => index === markerIndex || line.length <= EXCERPT_LINE_MAX_CHARS);
}

/** Clips a line to EXCERPT_LINE_MAX_CHARS UTF-16 units including the trailing "…", never splitting a surrogate pair. */
function clipLine(line: string): string {
  if (line.length <= EXCERPT_LINE_MAX_CHARS) return line;
  let end = EXCERPT_LINE_MAX_CHARS - 1;
  const last = line.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--;
  return `${line.slice(0, end)}…`;
}

/** The original text a group of shown lines still carries (clipped lines count only their kept part). */
function keptText(original: readonly string[], shown: readonly string[]): string {
  return shown.map((line, index) => (line === original[index] ? line : line.slice(0, -1))).join("\n");
}
