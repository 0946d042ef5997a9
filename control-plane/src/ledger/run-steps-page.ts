// ListRunSteps pages by bytes as well as by steps (issue #12, item 11): the observations of the
// page's steps are read in order with a running byte total in SQL, and only the rows within the
// page's budget are fetched, so a run with hundreds of MiB of output never sits in memory at once.
// A step whose observations do not fit continues on the next page: the step is sent again (same
// id, no model call) with the tool invocations from the one that was cut, that one's observations
// resuming after the last seq sent.
import type { RunStepRecord } from "../domain/records.js";
import { OBSERVATION_COLUMNS, type ObservationRow } from "./rows/ledger-rows.js";
import { decodePageToken, encodePageToken, raw, statement } from "./sql.js";

/** Where a page starts: after a whole step, or inside one (from an invocation, after an observation). */
export type StepsCursor =
  | { readonly kind: "after"; readonly index: number }
  | { readonly kind: "within"; readonly index: number; readonly ordinal: number; readonly afterSeq: number };

const MAX_INT32 = 2_147_483_647;
const canonical = (text: string | undefined): number | undefined => {
  if (text === undefined || !/^(0|[1-9]\d{0,9})$/.test(text)) return undefined;
  const value = Number(text);
  return value <= MAX_INT32 ? value : undefined;
};

/** undefined: not a token ListRunSteps issued (the API answers InvalidArgument on page_token). */
export function parseStepsPageToken(token: string): StepsCursor | undefined {
  if (!/^[A-Za-z0-9_-]+$/.test(token)) return undefined;
  const key = decodePageToken(token) ?? "";
  // Tokens issued before continuation pages were the bare step index.
  const bare = canonical(key);
  if (bare !== undefined) return { kind: "after", index: bare };
  const parts = key.split(":");
  if (parts[0] === "after" && parts.length === 2) {
    const index = canonical(parts[1]);
    return index === undefined ? undefined : { kind: "after", index };
  }
  if (parts[0] === "within" && parts.length === 4) {
    const [index, ordinal, afterSeq] = [canonical(parts[1]), canonical(parts[2]), canonical(parts[3])];
    if (index === undefined || ordinal === undefined || afterSeq === undefined) return undefined;
    return { kind: "within", index, ordinal, afterSeq };
  }
  return undefined;
}

export function encodeStepsPageToken(cursor: StepsCursor): string {
  return encodePageToken(cursor.kind === "after" ? `after:${cursor.index}` : `within:${cursor.index}:${cursor.ordinal}:${cursor.afterSeq}`);
}

/** The page's invocations in page order: the step's index and the invocation's ordinal. */
export interface PagedInvocation {
  readonly id: string;
  readonly stepIndex: number;
  readonly ordinal: number;
}

interface BudgetParams {
  ids: readonly string[];
  stepIndexes: readonly number[];
  ordinals: readonly number[];
  fromIndex: number;
  fromOrdinal: number;
  afterSeq: number;
  budget: number;
}

export type BudgetedObservationRow = ObservationRow & { step_index: number; ordinal: number; remaining: number };

/**
 * The observations of some invocations (each settled call's result last, as call_observations
 * shows it) in page order from a position, as many as fit in `budget` bytes of text (at least
 * one, so a page always moves on); `remaining` counts what was left out. The calls are named by
 * the array as well as joined: only a plain condition reaches into the view's result branch, so
 * it reads those calls by key instead of every settled call.
 * The running total reads only the texts' lengths; the texts fetched are the ones returned.
 */
export const budgetedObservations = statement<BudgetParams, BudgetedObservationRow>("run_query_budgeted_observations")`
  WITH page AS (
    SELECT o.id, x.step_index, x.ordinal, o.seq,
      sum(octet_length(o.text)) OVER (ORDER BY x.step_index, x.ordinal, o.seq) AS running,
      row_number() OVER (ORDER BY x.step_index, x.ordinal, o.seq) AS n,
      count(*) OVER () AS total
    FROM unnest(${(p) => p.ids}::uuid[], ${(p) => p.stepIndexes}::int[], ${(p) => p.ordinals}::int[]) AS x(id, step_index, ordinal)
    JOIN call_observations o ON o.tool_invocation_id = x.id
    WHERE o.tool_invocation_id = ANY(${(p) => p.ids}::uuid[])
      AND (x.step_index, x.ordinal, o.seq) > (${(p) => p.fromIndex}, ${(p) => p.fromOrdinal}, ${(p) => p.afterSeq})),
  kept AS (SELECT p.* FROM page p WHERE p.running <= ${(p) => p.budget} OR p.n = 1)
  SELECT ${raw(OBSERVATION_COLUMNS("o"))}, k.step_index, k.ordinal,
    ((SELECT max(total) FROM page) - (SELECT count(*) FROM kept))::int AS remaining
  FROM kept k JOIN call_observations o ON o.id = k.id AND o.tool_invocation_id = ANY(${(p) => p.ids}::uuid[])
  ORDER BY k.step_index, k.ordinal, k.seq`;

/** Step rows with an estimate of their stored size without observations (model call, invocations). */
export interface SizedStep {
  readonly index: number;
  readonly detail_bytes: number;
}

/** How many leading items fit `budget` by `weigh` (always the first, so a page is never empty). */
function leadingWithinBudget<T>(items: readonly T[], weigh: (item: T) => number, budget: number): number {
  let used = 0;
  let kept = 0;
  for (const item of items) {
    used += weigh(item);
    if (kept > 0 && used > budget) break;
    kept++;
  }
  return kept;
}

/** Keeps steps while their estimated detail fits the budget (always the first); returns how many. */
export function stepsWithinBudget(steps: readonly SizedStep[], budget: number): number {
  return leadingWithinBudget(steps, (step) => Number(step.detail_bytes), budget);
}

/** What a step's record weighs on the wire, roughly: its texts, the whole request included. */
export function stepRecordBytes(step: RunStepRecord): number {
  const call = step.modelCall;
  let bytes = call === undefined ? 0 : Buffer.byteLength(call.requestJson) + Buffer.byteLength(call.responseText) + Buffer.byteLength(call.toolCallsJson);
  for (const invocation of step.toolInvocations) {
    bytes += Buffer.byteLength(invocation.argumentsJson) + Buffer.byteLength(invocation.resultText ?? "");
    for (const observation of invocation.observations) bytes += Buffer.byteLength(observation.text);
  }
  return bytes;
}

/**
 * How many leading steps fit `budget` once their requests are expanded (always the first). The
 * SQL estimate sees a request as stored: a delta on the call before, which expands to the whole
 * transcript, so a long run's later steps weigh far more than their rows.
 */
export function expandedStepsWithinBudget(steps: readonly RunStepRecord[], budget: number): number {
  return leadingWithinBudget(steps, stepRecordBytes, budget);
}
