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
import { expandModelRequests, type StoredModelRequest } from "../domain/model-request.js";
import {
  toArtifactRecord,
  toModelCallRecord,
  toObservationRecord,
  toRunEventRecord,
  toRunRecord,
  toToolInvocationRecord,
  toTriggerRecord,
} from "./row-mapping.js";
import { asDate, decodePageToken, encodePageToken, rows, type Sql } from "./sql.js";
import { AGENT_CEILING_SQL } from "./ledger-writes.js";
import { systemClock, type Clock } from "../domain/clock.js";

export interface RunFilter {
  readonly agentId?: string;
  readonly conversationId?: string;
  readonly status?: RunStatus;
}

/** Operator reads of the ledger. */
export interface RunQueries {
  getRun(runId: string): Promise<RunRecord | undefined>;
  listRuns(filter: RunFilter, pageSize: number, pageToken: string): Promise<Page<RunRecord>>;
  listSteps(runId: string, pageSize: number, pageToken: string): Promise<Page<RunStepRecord>>;
  getStep(runId: string, stepId: string): Promise<RunStepRecord | undefined>;
  listArtifacts(runId: string): Promise<readonly ArtifactRecord[]>;
  eventsAfter(runId: string, afterSeq: number, limit: number): Promise<readonly RunEventRecord[]>;
  getToolInvocation(runId: string, invocationId: string): Promise<ToolInvocationRecord | undefined>;
  /** Runs waiting on an unknown write outcome, with the invocations to resolve. */
  listUnknownOutcomes(limit: number): Promise<readonly ToolInvocationRecord[]>;
}

/** Whether run o is ahead of run r in a conversation's queue (see MAILBOX_ORDER_SQL). */
const AHEAD_SQL = `(coalesce(o.request_received_at, o.created_at), o.created_at, o.id) < (coalesce(r.request_received_at, r.created_at), r.created_at, r.id)`;

/**
 * Why a queued run has not started, worked out from the ledger as it is now, so the reason is
 * never stale: paused, still coalescing, behind another run of its conversation, or held by
 * its agent's or the install's ceiling. Its position is its place in that queue (its
 * conversation's when that is what holds it, else its agent's), from 1.
 */
const WAITING_SQL = `
  CASE WHEN r.status <> 'queued' THEN r.wait_reason
    WHEN r.paused THEN 'paused'
    WHEN r.started_at IS NULL AND r.not_before > ? THEN 'coalescing'
    WHEN r.started_at IS NULL AND r.parent_run_id IS NULL AND EXISTS (
      SELECT 1 FROM runs o WHERE o.conversation_id = r.conversation_id AND o.parent_run_id IS NULL AND o.id <> r.id
        AND ((o.started_at IS NOT NULL AND o.status IN ('queued', 'running', 'awaiting_tool', 'awaiting_input', 'waiting'))
          OR (o.status = 'queued' AND o.started_at IS NULL AND ${AHEAD_SQL}))) THEN 'conversation_busy'
    WHEN r.parent_run_id IS NULL AND (
      (SELECT count(*) FROM runs x WHERE x.agent_id = r.agent_id AND x.parent_run_id IS NULL AND x.status IN ('running', 'awaiting_tool'))
        >= ${AGENT_CEILING_SQL}
      OR (SELECT count(*) FROM runs x WHERE x.parent_run_id IS NULL AND x.status IN ('running', 'awaiting_tool')) >= ?)
      THEN 'concurrency_ceiling'
    ELSE r.wait_reason END`;

const RUN_COLUMNS = `r.*, c.external_id AS external_conversation_id, waiting.reason AS effective_wait_reason,
  CASE WHEN r.status <> 'queued' OR r.paused THEN 0
    WHEN waiting.reason = 'conversation_busy' THEN 1 + (
      SELECT count(*) FROM runs o WHERE o.conversation_id = r.conversation_id AND o.parent_run_id IS NULL AND o.status = 'queued'
        AND o.started_at IS NULL AND ${AHEAD_SQL})
    ELSE 1 + (
      SELECT count(*) FROM runs o WHERE o.agent_id = r.agent_id AND o.parent_run_id IS NULL AND o.status = 'queued' AND NOT o.paused
        AND (o.created_at, o.id) < (r.created_at, r.id)) END AS queue_position`;

const RUN_FROM = `runs r JOIN conversations c ON c.id = r.conversation_id JOIN agents a ON a.id = r.agent_id
  CROSS JOIN LATERAL (SELECT ${WAITING_SQL} AS reason) waiting`;

export interface RunQueryOptions {
  /** Coalescing is judged on this clock, as admission judges it. */
  readonly clock?: Clock;
  readonly maxConcurrentRootRuns?: number;
}

export function createRunQueryRepository(sql: Sql, options: RunQueryOptions = {}): RunQueries {
  const clock = options.clock ?? systemClock;
  const installCeiling = options.maxConcurrentRootRuns ?? 64;
  /** Bindings of RUN_FROM's two parameters, which come before any of a query's own. */
  const view = (): unknown[] => [clock.now(), installCeiling];
  const triggersOf = async (runIds: readonly string[]): Promise<Map<string, TriggerRecord[]>> => {
    const byRun = new Map<string, TriggerRecord[]>(runIds.map((id) => [id, []]));
    if (runIds.length === 0) return byRun;
    const found = await rows<Record<string, unknown>>(
      sql,
      "SELECT * FROM run_triggers WHERE run_id = ANY(?::uuid[]) ORDER BY received_at, ordinal",
      [runIds],
    );
    for (const row of found) byRun.get(row["run_id"] as string)?.push(toTriggerRecord(row));
    return byRun;
  };

  const stepsWithDetail = async (stepRows: Record<string, unknown>[]): Promise<RunStepRecord[]> => {
    const stepIds = stepRows.map((s) => s["id"] as string);
    if (stepIds.length === 0) return [];
    const [calls, invocations] = await Promise.all([
      rows<Record<string, unknown>>(sql, "SELECT * FROM model_calls WHERE step_id = ANY(?::uuid[])", [stepIds]).then((found) => withWholeRequests(sql, found)),
      rows<Record<string, unknown>>(sql, "SELECT * FROM tool_invocations WHERE step_id = ANY(?::uuid[]) ORDER BY ordinal", [stepIds]),
    ]);
    const observations = await rows<Record<string, unknown>>(
      sql,
      "SELECT * FROM observations WHERE tool_invocation_id = ANY(?::uuid[]) ORDER BY seq",
      [invocations.map((i) => i["id"] as string)],
    );
    const invocationsByStep = new Map<string, ToolInvocationRecord[]>();
    for (const row of invocations) {
      const mine = observations.filter((o) => o["tool_invocation_id"] === row["id"]).map(toObservationRecord);
      const list = invocationsByStep.get(row["step_id"] as string) ?? [];
      list.push(toToolInvocationRecord(row, mine));
      invocationsByStep.set(row["step_id"] as string, list);
    }
    return stepRows.map((row) => {
      const call = calls.find((c) => c["step_id"] === row["id"]);
      return {
        id: row["id"] as string,
        runId: row["run_id"] as string,
        index: Number(row["index"]),
        replayability: row["replayability"] as RunStepRecord["replayability"],
        runStatusAfter: row["run_status_after"] as RunStatus,
        actorId: (row["actor_id"] as string | null) ?? undefined,
        leaseEpoch: Number(row["lease_epoch"]),
        startedAt: asDate(row["started_at"]),
        committedAt: asDate(row["committed_at"]),
        modelCall: call === undefined ? undefined : toModelCallRecord(call),
        toolInvocations: invocationsByStep.get(row["id"] as string) ?? [],
      };
    });
  };

  return {
    async getRun(runId) {
      const [row] = await rows<Record<string, unknown>>(sql, `SELECT ${RUN_COLUMNS} FROM ${RUN_FROM} WHERE r.id = ?`, [...view(), runId]);
      if (row === undefined) return undefined;
      return toRunRecord(row, (await triggersOf([runId])).get(runId) ?? []);
    },

    async listRuns(filter, pageSize, pageToken) {
      // Newest first; the token is the last row's (created_at, id).
      const after = decodePageToken(pageToken);
      const where: string[] = [];
      const bindings: unknown[] = [];
      if (filter.agentId !== undefined) {
        where.push("r.agent_id = ?");
        bindings.push(filter.agentId);
      }
      if (filter.conversationId !== undefined) {
        where.push("c.external_id = ?");
        bindings.push(filter.conversationId);
      }
      if (filter.status !== undefined) {
        where.push("r.status = ?");
        bindings.push(filter.status);
      }
      if (after !== undefined) {
        const [createdAt, id] = after.split("|");
        where.push("(r.created_at, r.id) < (?::timestamptz, ?::uuid)");
        bindings.push(createdAt, id);
      }
      const found = await rows<Record<string, unknown>>(
        sql,
        `SELECT ${RUN_COLUMNS} FROM ${RUN_FROM}
         ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""}
         ORDER BY r.created_at DESC, r.id DESC LIMIT ?`,
        [...view(), ...bindings, pageSize + 1],
      );
      const page = found.slice(0, pageSize);
      const triggers = await triggersOf(page.map((r) => r["id"] as string));
      const items = page.map((row) => toRunRecord(row, triggers.get(row["id"] as string) ?? []));
      const last = page.at(-1);
      return {
        items,
        nextPageToken:
          found.length > pageSize && last !== undefined
            ? encodePageToken(`${asDate(last["created_at"]).toISOString()}|${String(last["id"])}`)
            : "",
      };
    },

    async listSteps(runId, pageSize, pageToken) {
      const afterIndex = Number(decodePageToken(pageToken) ?? -1);
      const found = await rows<Record<string, unknown>>(
        sql,
        `SELECT * FROM run_steps WHERE run_id = ? AND index > ? ORDER BY index LIMIT ?`,
        [runId, Number.isFinite(afterIndex) ? afterIndex : -1, pageSize + 1],
      );
      const page = found.slice(0, pageSize);
      const last = page.at(-1);
      return {
        items: await stepsWithDetail(page),
        nextPageToken: found.length > pageSize && last !== undefined ? encodePageToken(String(last["index"])) : "",
      };
    },

    async getStep(runId, stepId) {
      const found = await rows<Record<string, unknown>>(sql, "SELECT * FROM run_steps WHERE run_id = ? AND id = ?", [runId, stepId]);
      const [step] = await stepsWithDetail(found);
      return step;
    },

    async listArtifacts(runId) {
      const found = await rows<Record<string, unknown>>(sql, "SELECT * FROM artifacts WHERE run_id = ? ORDER BY created_at", [runId]);
      return found.map(toArtifactRecord);
    },

    async getToolInvocation(runId, invocationId) {
      const [row] = await rows<Record<string, unknown>>(sql, "SELECT * FROM tool_invocations WHERE run_id = ? AND id = ?", [runId, invocationId]);
      if (row === undefined) return undefined;
      const observations = await rows<Record<string, unknown>>(sql, "SELECT * FROM observations WHERE tool_invocation_id = ? ORDER BY seq", [invocationId]);
      return toToolInvocationRecord(row, observations.map(toObservationRecord));
    },

    async listUnknownOutcomes(limit) {
      const found = await rows<Record<string, unknown>>(
        sql,
        `SELECT i.* FROM tool_invocations i JOIN runs r ON r.id = i.run_id
         WHERE i.status = 'unknown_outcome' AND i.resolved_outcome IS NULL AND r.status = 'waiting'
         ORDER BY i.created_at LIMIT ?`,
        [limit],
      );
      return found.map((row) => toToolInvocationRecord(row, []));
    },

    async eventsAfter(runId, afterSeq, limit) {
      const found = await rows<Record<string, unknown>>(
        sql,
        "SELECT * FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        [runId, afterSeq, limit],
      );
      return found.map(toRunEventRecord);
    },
  };
}

/**
 * Model calls with their whole requests: a request stored as a delta on an earlier call is
 * expanded from the run's chain of calls (read only when a delta is present).
 */
async function withWholeRequests(sql: Sql, calls: Record<string, unknown>[]): Promise<Record<string, unknown>[]> {
  const deltaRuns = [...new Set(calls.filter((c) => typeof (c["request"] as { base?: unknown } | null)?.base === "string").map((c) => c["run_id"] as string))];
  if (deltaRuns.length === 0) return calls;
  const chain = await rows<{ id: string; request: StoredModelRequest }>(sql, "SELECT id, request FROM model_calls WHERE run_id = ANY(?::uuid[])", [deltaRuns]);
  const whole = expandModelRequests(chain);
  return calls.map((call) => ({ ...call, request: whole.get(call["id"] as string) ?? call["request"] }));
}
