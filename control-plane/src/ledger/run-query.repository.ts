import type {
  ArtifactRecord,
  Page,
  RunEventRecord,
  RunRecord,
  RunStepRecord,
  ToolInvocationRecord,
  TriggerRecord,
} from "../domain/records.js";
import type { RunStatus } from "../domain/run.js";
import { ResourceExhaustedError } from "../domain/errors.js";
import { expandModelRequests, type StoredModelRequest } from "../domain/model-request.js";
import { systemClock, type Clock } from "../domain/clock.js";
import {
  toArtifactRecord,
  toModelCallRecord,
  toObservationRecord,
  toRunEventRecord,
  toRunRecord,
  toToolInvocationRecord,
  toTriggerRecord,
} from "./row-mapping.js";
import {
  ARTIFACT_COLUMNS,
  MODEL_CALL_COLUMNS,
  OBSERVATION_COLUMNS,
  RUN_EVENT_COLUMNS,
  RUN_STEP_COLUMNS,
  RUN_TRIGGER_COLUMNS,
  TOOL_INVOCATION_COLUMNS,
  type ArtifactRow,
  type ModelCallRow,
  type ObservationRow,
  type RunEventRow,
  type RunStepRow,
  type RunTriggerRow,
  type ToolInvocationRow,
} from "./rows/ledger-rows.js";
import { encodeRunsPageToken, listRunsPage, parseRunsPageToken, selectRun } from "./run-view.sql.js";
import { raw, statement, type Sql } from "./sql.js";
import { budgetedObservations, encodeStepsPageToken, expandedStepsWithinBudget, parseStepsPageToken, stepsWithinBudget, type StepsCursor } from "./run-steps-page.js";
import { requestBytesSql, requestWithToolsSql } from "./tool-sets.js";

export { parseRunsPageToken } from "./run-view.sql.js";
export { parseStepsPageToken } from "./run-steps-page.js";

/** A ListRunSteps page's default budget for its records' bytes; the API passes one below its message limit. */
export const DEFAULT_STEPS_PAGE_BYTES = 1024 * 1024;

export interface RunFilter {
  readonly agentId?: string;
  readonly conversationId?: string;
  readonly status?: RunStatus;
}

/** Operator reads of the ledger. */
export interface RunQueries {
  getRun(runId: string): Promise<RunRecord | undefined>;
  listRuns(filter: RunFilter, pageSize: number, pageToken: string): Promise<Page<RunRecord>>;
  /** At most pageSize steps and about budgetBytes of their records; a token it did not issue throws. */
  listSteps(runId: string, pageSize: number, pageToken: string, budgetBytes?: number): Promise<Page<RunStepRecord>>;
  /** At most pageSize steps as a list shows them (stepSummary); the same page tokens as listSteps. */
  listStepSummaries(runId: string, pageSize: number, pageToken: string): Promise<Page<RunStepRecord>>;
  /** One step whole; ResourceExhaustedError, before anything is loaded, when its records exceed budgetBytes. */
  getStep(runId: string, stepId: string, budgetBytes?: number): Promise<RunStepRecord | undefined>;
  /** One step as a list shows it (stepSummary). */
  getStepSummary(runId: string, stepId: string): Promise<RunStepRecord | undefined>;
  listArtifacts(runId: string): Promise<readonly ArtifactRecord[]>;
  eventsAfter(runId: string, afterSeq: number, limit: number): Promise<readonly RunEventRecord[]>;
  getToolInvocation(runId: string, invocationId: string): Promise<ToolInvocationRecord | undefined>;
  /** Runs waiting on an unknown write outcome, with the invocations to resolve. */
  listUnknownOutcomes(limit: number): Promise<readonly ToolInvocationRecord[]>;
}

const runId = (p: { readonly runId: string }) => p.runId;
const ids = (p: { readonly ids: readonly string[] }) => p.ids;
const limit = (p: { readonly limit: number }) => p.limit;

const triggersOfRuns = statement<{ ids: readonly string[] }, RunTriggerRow>("run_query_triggers")`
  SELECT ${raw(RUN_TRIGGER_COLUMNS("t"))} FROM run_triggers t WHERE t.run_id = ANY(${ids}::uuid[]) ORDER BY t.received_at, t.ordinal`;

/**
 * Steps from an index, each with its stored size apart from observations: sizes as stored, read
 * without detoasting, and a request's tool list counted as the readers put it back.
 */
const stepsFrom = statement<{ runId: string; fromIndex: number; limit: number }, RunStepRow & { detail_bytes: number }>("run_query_steps")`
  SELECT ${raw(RUN_STEP_COLUMNS("s"))},
    (coalesce((SELECT sum(${raw(requestBytesSql("m"))} + coalesce(octet_length(m.response_text), 0)) FROM model_calls m WHERE m.run_id = s.run_id AND m.step_id = s.id), 0)
     + coalesce((SELECT sum(pg_column_size(i.arguments) + coalesce(octet_length(i.result_text), 0)) FROM tool_invocations i WHERE i.run_id = s.run_id AND i.step_id = s.id), 0)
    )::float8 AS detail_bytes
  FROM run_steps s
  WHERE s.run_id = ${runId}::uuid AND s.index >= ${(p) => p.fromIndex} ORDER BY s.index LIMIT ${limit}`;

/**
 * A step's records' size: observations' text, stored model call and invocations. Its calls are
 * named as an array, a plain condition that reaches into call_observations' result branch by key.
 */
const stepBytes = statement<{ runId: string; stepId: string }, { bytes: number }>("run_query_step_bytes")`
  SELECT (coalesce((SELECT sum(octet_length(o.text)) FROM call_observations o
                    WHERE o.tool_invocation_id = ANY(ARRAY(SELECT i.id FROM tool_invocations i WHERE i.step_id = ${(p) => p.stepId}::uuid AND i.run_id = ${runId}::uuid))), 0)
    + coalesce((SELECT sum(${raw(requestBytesSql("m"))} + coalesce(octet_length(m.response_text), 0)) FROM model_calls m WHERE m.run_id = ${runId}::uuid AND m.step_id = ${(p) => p.stepId}::uuid), 0)
  )::float8 AS bytes`;

const selectStep = statement<{ runId: string; stepId: string }, RunStepRow>("run_query_step")`
  SELECT ${raw(RUN_STEP_COLUMNS("s"))} FROM run_steps s WHERE s.run_id = ${runId}::uuid AND s.id = ${(p) => p.stepId}::uuid`;

/**
 * Steps' calls are found through their steps' runs: tool_invocations is indexed by (run_id,
 * step_id), and a step's model call is read from the step's own row through the view model_calls.
 */
const CALLS_OF_STEPS = "run_steps s JOIN model_calls m ON m.run_id = s.run_id AND m.step_id = s.id";
const INVOCATIONS_OF_STEPS = "run_steps s JOIN tool_invocations i ON i.run_id = s.run_id AND i.step_id = s.id";

const modelCallsOfSteps = statement<{ ids: readonly string[] }, ModelCallRow>("run_query_model_calls")`
  SELECT ${raw(MODEL_CALL_COLUMNS("m", { request: requestWithToolsSql("m") }))} FROM ${raw(CALLS_OF_STEPS)} WHERE s.id = ANY(${ids}::uuid[])`;

/** Steps from an index, for summaries: no sizes, since page_size alone bounds their pages. */
const stepRowsFrom = statement<{ runId: string; fromIndex: number; limit: number }, RunStepRow>("run_query_step_rows")`
  SELECT ${raw(RUN_STEP_COLUMNS("s"))} FROM run_steps s
  WHERE s.run_id = ${runId}::uuid AND s.index >= ${(p) => p.fromIndex} ORDER BY s.index LIMIT ${limit}`;

// What stepSummary leaves out is not read at all: a step's request, response and tool-call texts,
// its tools' arguments and results.
const modelCallSummariesOfSteps = statement<{ ids: readonly string[] }, ModelCallRow>("run_query_model_call_summaries")`
  SELECT ${raw(MODEL_CALL_COLUMNS("m", { request: "NULL", response_text: "NULL", tool_calls: "NULL" }))}
  FROM ${raw(CALLS_OF_STEPS)} WHERE s.id = ANY(${ids}::uuid[])`;
const invocationSummariesOfSteps = statement<{ ids: readonly string[] }, ToolInvocationRow>("run_query_step_invocation_summaries")`
  SELECT ${raw(TOOL_INVOCATION_COLUMNS("i", { arguments: "NULL", result_text: "NULL" }))}
  FROM ${raw(INVOCATIONS_OF_STEPS)} WHERE s.id = ANY(${ids}::uuid[]) ORDER BY i.ordinal`;

/** Every stored request of some runs: what a delta-stored request is expanded from. */
const requestChains = statement<{ ids: readonly string[] }, { id: string; request: StoredModelRequest }>("run_query_request_chains")`
  SELECT m.id, ${raw(requestWithToolsSql("m"))} AS request FROM model_calls m WHERE m.run_id = ANY(${ids}::uuid[])`;

const invocationsOfSteps = statement<{ ids: readonly string[] }, ToolInvocationRow>("run_query_step_invocations")`
  SELECT ${raw(TOOL_INVOCATION_COLUMNS("i"))} FROM ${raw(INVOCATIONS_OF_STEPS)} WHERE s.id = ANY(${ids}::uuid[]) ORDER BY i.ordinal`;

/** What the calls observed, each settled call's result last (call_observations adds it from the call). */
const observationsOf = statement<{ ids: readonly string[] }, ObservationRow>("run_query_observations")`
  SELECT ${raw(OBSERVATION_COLUMNS("o"))} FROM call_observations o WHERE o.tool_invocation_id = ANY(${ids}::uuid[]) ORDER BY o.seq`;

const selectInvocation = statement<{ runId: string; invocationId: string }, ToolInvocationRow>("run_query_invocation")`
  SELECT ${raw(TOOL_INVOCATION_COLUMNS("i"))} FROM tool_invocations i
  WHERE i.run_id = ${runId}::uuid AND i.id = ${(p) => p.invocationId}::uuid`;

const unknownOutcomes = statement<{ limit: number }, ToolInvocationRow>("run_query_unknown_outcomes")`
  SELECT ${raw(TOOL_INVOCATION_COLUMNS("i"))} FROM tool_invocations i JOIN runs r ON r.id = i.run_id
  WHERE i.status = 'unknown_outcome' AND i.resolved_outcome IS NULL AND r.status = 'waiting'
  ORDER BY i.created_at LIMIT ${limit}`;

const artifactsOfRun = statement<{ runId: string }, ArtifactRow>("run_query_artifacts")`
  SELECT ${raw(ARTIFACT_COLUMNS("a"))} FROM artifacts a WHERE a.run_id = ${runId}::uuid ORDER BY a.created_at`;

/** A run's events after a number: run_event_feed adds those its steps and settled calls say to its stored rows. */
const eventsOfRun = statement<{ runId: string; afterSeq: number; limit: number }, RunEventRow>("run_query_events")`
  SELECT ${raw(RUN_EVENT_COLUMNS("e"))} FROM run_event_feed e
  WHERE e.run_id = ${runId}::uuid AND e.seq > ${(p) => p.afterSeq} ORDER BY e.seq LIMIT ${limit}`;

export interface RunQueryOptions {
  /** Coalescing is judged on this clock, as admission judges it. */
  readonly clock?: Clock;
}

export function createRunQueryRepository(sql: Sql, options: RunQueryOptions = {}): RunQueries {
  const clock = options.clock ?? systemClock;

  const triggersOf = async (runIds: readonly string[]): Promise<Map<string, TriggerRecord[]>> => {
    const byRun = new Map<string, TriggerRecord[]>(runIds.map((id) => [id, []]));
    if (runIds.length === 0) return byRun;
    for (const row of await sql.run(triggersOfRuns, { ids: runIds })) byRun.get(row.run_id)?.push(toTriggerRecord(row));
    return byRun;
  };

  /**
   * Steps with their model calls, invocations and observations. `observationsFor` reads the
   * observations of the invocations kept (all of them unless a page reads within its budget);
   * `keep` drops invocations a page does not carry.
   */
  const stepsWithDetail = async (
    steps: readonly RunStepRow[],
    observationsFor: (invocations: readonly ToolInvocationRow[]) => Promise<readonly ObservationRow[]> = (found) =>
      found.length === 0 ? Promise.resolve([]) : sql.run(observationsOf, { ids: found.map((i) => i.id) }),
    keep: (invocation: ToolInvocationRow) => boolean = () => true,
    withoutModelCall?: string,
  ): Promise<RunStepRecord[]> => {
    if (steps.length === 0) return [];
    const stepIds = steps.map((s) => s.id);
    const [calls, allInvocations] = await Promise.all([
      sql.run(modelCallsOfSteps, { ids: stepIds.filter((id) => id !== withoutModelCall) }).then((found) => withWholeRequests(sql, found)),
      sql.run(invocationsOfSteps, { ids: stepIds }),
    ]);
    const invocations = allInvocations.filter(keep);
    return stepRecords(steps, calls, invocations, await observationsFor(invocations));
  };

  /** Steps as a list shows them (stepSummary), read without the columns a summary leaves out. */
  const stepSummaries = async (steps: readonly RunStepRow[]): Promise<RunStepRecord[]> => {
    if (steps.length === 0) return [];
    const stepIds = steps.map((s) => s.id);
    const [calls, invocations] = await Promise.all([sql.run(modelCallSummariesOfSteps, { ids: stepIds }), sql.run(invocationSummariesOfSteps, { ids: stepIds })]);
    return stepRecords(steps, calls, invocations, []).map(stepSummary);
  };

  return {
    async getRun(id) {
      const [row] = await sql.run(selectRun, { now: clock.now(), runId: id });
      if (row === undefined) return undefined;
      return toRunRecord(row, (await triggersOf([id])).get(id) ?? []);
    },

    async listRuns(filter, pageSize, pageToken) {
      const after = pageToken === "" ? undefined : parseRunsPageToken(pageToken);
      // The API refuses a token it did not issue (run-service.ts); here one is a caller's bug.
      if (pageToken !== "" && after === undefined) throw new Error("listRuns: not a page token from listRuns");
      const found = await sql.run(listRunsPage, {
        now: clock.now(),
        agentId: filter.agentId ?? null,
        externalConversationId: filter.conversationId ?? null,
        status: filter.status ?? null,
        afterCreatedAt: after?.createdAt ?? null,
        afterId: after?.id ?? null,
        limit: pageSize + 1,
      });
      const page = found.slice(0, pageSize);
      const triggers = await triggersOf(page.map((r) => r.id));
      const last = page.at(-1);
      return {
        items: page.map((row) => toRunRecord(row, triggers.get(row.id) ?? [])),
        nextPageToken: found.length > pageSize && last !== undefined ? encodeRunsPageToken({ createdAt: last.page_key, id: last.id }) : "",
      };
    },

    async listSteps(id, pageSize, pageToken, budgetBytes = DEFAULT_STEPS_PAGE_BYTES) {
      const cursor = stepsCursor(pageToken);
      const fromIndex = firstIndex(cursor);
      const found = await sql.run(stepsFrom, { runId: id, fromIndex, limit: pageSize + 1 });
      const kept = stepsWithinBudget(found.slice(0, pageSize), budgetBytes);
      const page = found.slice(0, kept);
      const detailBytes = page.reduce((sum, step) => sum + Number(step.detail_bytes), 0);
      const within = cursor.kind === "within" ? cursor : undefined;
      const first = page[0];
      // A continued step carries only the invocations from the one that was cut.
      const carried = (row: ToolInvocationRow) => within === undefined || row.step_id !== first?.id || Number(row.ordinal) >= within.ordinal;
      let cut: { stepIndex: number; ordinal: number; seq: number } | undefined;
      const readObservations = async (invocations: readonly ToolInvocationRow[]): Promise<ObservationRow[]> => {
        const indexOf = new Map(page.map((step) => [step.id, Number(step.index)]));
        const paged = invocations.filter((row) => row.step_id !== null && indexOf.has(row.step_id));
        if (paged.length === 0) return [];
        const rows = await sql.run(budgetedObservations, {
          ids: paged.map((row) => row.id),
          stepIndexes: paged.map((row) => indexOf.get(row.step_id ?? "") ?? 0),
          ordinals: paged.map((row) => Number(row.ordinal)),
          fromIndex: within?.index ?? -1,
          fromOrdinal: within?.ordinal ?? 0,
          afterSeq: within?.afterSeq ?? 0,
          budget: Math.max(0, budgetBytes - detailBytes),
        });
        const last = rows.at(-1);
        if (last !== undefined && Number(last.remaining) > 0) {
          cut = { stepIndex: Number(last.step_index), ordinal: Number(last.ordinal), seq: Number(last.seq) };
        }
        return rows;
      };
      let items = await stepsWithDetail(page, readObservations, carried, within === undefined ? undefined : first?.id);
      if (cut !== undefined) {
        // The page ends inside the step that was cut; what follows it comes on the next page.
        const at = cut;
        items = items
          .filter((step) => step.index <= at.stepIndex)
          .map((step) => (step.index === at.stepIndex ? { ...step, toolInvocations: step.toolInvocations.filter((i) => i.ordinal <= at.ordinal) } : step));
      }
      // Expanded requests can outweigh the estimate: the page then ends after the last step that fits.
      const fit = expandedStepsWithinBudget(items, budgetBytes);
      const lastKept = items[fit - 1];
      if (fit < items.length && lastKept !== undefined && lastKept.index !== cut?.stepIndex) {
        return { items: items.slice(0, fit), nextPageToken: encodeStepsPageToken({ kind: "after", index: lastKept.index }) };
      }
      if (cut !== undefined) {
        return { items, nextPageToken: encodeStepsPageToken({ kind: "within", index: cut.stepIndex, ordinal: cut.ordinal, afterSeq: cut.seq }) };
      }
      const last = page.at(-1);
      return { items, nextPageToken: found.length > kept && last !== undefined ? encodeStepsPageToken({ kind: "after", index: Number(last.index) }) : "" };
    },

    async listStepSummaries(id, pageSize, pageToken) {
      // A token from a full listing may point inside a step: its summary is whole, so it starts there.
      const found = await sql.run(stepRowsFrom, { runId: id, fromIndex: firstIndex(stepsCursor(pageToken)), limit: pageSize + 1 });
      const page = found.slice(0, pageSize);
      const last = page.at(-1);
      return {
        items: await stepSummaries(page),
        nextPageToken: found.length > pageSize && last !== undefined ? encodeStepsPageToken({ kind: "after", index: Number(last.index) }) : "",
      };
    },

    async getStep(id, stepId, budgetBytes) {
      if (budgetBytes !== undefined) {
        const [size] = await sql.run(stepBytes, { runId: id, stepId });
        if (size !== undefined && Number(size.bytes) > budgetBytes) {
          throw new ResourceExhaustedError(`step ${stepId} holds about ${Math.round(Number(size.bytes))} bytes, more than one reply carries; ListRunSteps pages it`);
        }
      }
      const [step] = await stepsWithDetail(await sql.run(selectStep, { runId: id, stepId }));
      return step;
    },

    async getStepSummary(id, stepId) {
      const [step] = await stepSummaries(await sql.run(selectStep, { runId: id, stepId }));
      return step;
    },

    async listArtifacts(id) {
      return (await sql.run(artifactsOfRun, { runId: id })).map(toArtifactRecord);
    },

    async getToolInvocation(id, invocationId) {
      const [row] = await sql.run(selectInvocation, { runId: id, invocationId });
      if (row === undefined) return undefined;
      const observations = await sql.run(observationsOf, { ids: [invocationId] });
      return toToolInvocationRecord(row, observations.map(toObservationRecord));
    },

    async listUnknownOutcomes(max) {
      return (await sql.run(unknownOutcomes, { limit: max })).map((row) => toToolInvocationRecord(row, []));
    },

    async eventsAfter(id, afterSeq, max) {
      return (await sql.run(eventsOfRun, { runId: id, afterSeq, limit: max })).map(toRunEventRecord);
    },
  };
}

/** Where a page token says a page starts; the API refuses a token it did not issue, so here one is a caller's bug. */
function stepsCursor(pageToken: string): StepsCursor {
  const cursor: StepsCursor | undefined = pageToken === "" ? { kind: "after", index: -1 } : parseStepsPageToken(pageToken);
  if (cursor === undefined) throw new Error("not a page token from ListRunSteps");
  return cursor;
}

const firstIndex = (cursor: StepsCursor): number => (cursor.kind === "after" ? cursor.index + 1 : cursor.index);

/** Step records from their rows, each with its model call and its invocations and their observations. */
function stepRecords(
  steps: readonly RunStepRow[],
  calls: readonly ModelCallRow[],
  invocations: readonly ToolInvocationRow[],
  observations: readonly ObservationRow[],
): RunStepRecord[] {
  const invocationsByStep = new Map<string, ToolInvocationRecord[]>();
  for (const row of invocations) {
    if (row.step_id === null) continue;
    const mine = observations.filter((o) => o.tool_invocation_id === row.id).map(toObservationRecord);
    const list = invocationsByStep.get(row.step_id) ?? [];
    list.push(toToolInvocationRecord(row, mine));
    invocationsByStep.set(row.step_id, list);
  }
  return steps.map((row) => {
    const call = calls.find((c) => c.step_id === row.id);
    return {
      id: row.id,
      runId: row.run_id,
      index: Number(row.index),
      replayability: row.replayability,
      runStatusAfter: row.run_status_after,
      actorId: row.actor_id ?? undefined,
      leaseEpoch: Number(row.lease_epoch),
      startedAt: row.started_at,
      committedAt: row.committed_at,
      modelCall: call === undefined ? undefined : toModelCallRecord(call),
      toolInvocations: invocationsByStep.get(row.id) ?? [],
    };
  });
}

/**
 * A step as a list shows it: without what grows with the run (its model request, which repeats the
 * transcript so far, the response and tool-call texts) or with a tool's output (arguments, result,
 * observations). Its identity, usage, statuses and resolutions stay.
 */
function stepSummary(step: RunStepRecord): RunStepRecord {
  const call = step.modelCall;
  return {
    ...step,
    modelCall: call === undefined ? undefined : { ...call, requestJson: "", responseText: "", toolCallsJson: "" },
    toolInvocations: step.toolInvocations.map((tool) => ({ ...tool, argumentsJson: "", resultText: undefined, observations: [] })),
  };
}

/**
 * Model calls with their whole requests: a request stored as a delta on an earlier call is
 * expanded from the run's chain of calls (read only when a delta is present).
 */
async function withWholeRequests(sql: Sql, calls: readonly ModelCallRow[]): Promise<ModelCallRow[]> {
  const deltaRuns = [...new Set(calls.filter((c) => typeof (c.request as { readonly base?: unknown } | null)?.base === "string").map((c) => c.run_id))];
  if (deltaRuns.length === 0) return [...calls];
  const whole = expandModelRequests(await sql.run(requestChains, { ids: deltaRuns }));
  return calls.map((call) => ({ ...call, request: whole.get(call.id) ?? call.request }));
}
