import { randomUUID } from "node:crypto";
import { LeaseLostError } from "../domain/errors.js";
import type { Fence, ObservationLog, RunStore } from "../runner/run-store.js";
import { appendRunEvents } from "./ledger-writes.js";
import { createRunClaimRepository, type RunClaimOptions } from "./run-claim.repository.js";
import { createRunHistoryRepository } from "./run-history.repository.js";
import { loadTriggers } from "./run-triggers.js";
import { fragment, raw, statement, type Sql } from "./sql.js";
import { DEFAULT_GROUP_COMMIT } from "./group-commit.js";
import { createStepCommitRepository } from "./step-commit.repository.js";

export interface RunRepositoryOptions extends RunClaimOptions {
  /** How long the event loop polls for a lone step commit's reply before it sleeps (group-commit.ts); 0 by default. */
  readonly commitPollMs?: number;
}

const runId = (p: { readonly runId: string }) => p.runId;
const epoch = (p: { readonly epoch: number }) => p.epoch;
const workerId = (p: { readonly workerId: string }) => p.workerId;
const invocation = (p: { readonly invocationId: string }) => p.invocationId;

const renewLeaseStatement = statement<{ runId: string; workerId: string; epoch: number; leaseMs: number }, { renewed: boolean; taken: boolean | null }>("run_renew_lease")`
  WITH renewed AS (
    UPDATE runs SET lease_expires_at = now() + make_interval(secs => ${(p) => p.leaseMs} / 1000.0)
    WHERE id = ${runId}::uuid AND lease_owner = ${workerId} AND lease_epoch = ${epoch} RETURNING id)
  SELECT EXISTS (SELECT 1 FROM renewed) AS renewed, (SELECT lease_epoch > ${epoch} FROM runs WHERE id = ${runId}::uuid) AS taken`;

const releaseStatement = statement<Fence, { id: string }>("run_release")`
  UPDATE runs SET status = 'queued', wait_reason = CASE WHEN paused THEN 'paused' ELSE wait_reason END,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  WHERE id = ${runId}::uuid AND lease_epoch = ${epoch} AND lease_owner = ${workerId} RETURNING id`;

/** The runner's ledger: claims, history, fenced commits and observations, composed from one repository per concern. */
export function createRunRepository(sql: Sql, options: RunRepositoryOptions = {}): RunStore {
  return {
    ...createRunClaimRepository(sql, options),
    ...createRunHistoryRepository(sql),
    ...createStepCommitRepository(sql, options.durability ?? "strict", { ...DEFAULT_GROUP_COMMIT, pollAloneMs: options.commitPollMs ?? 0 }),
    loadTriggers: loadTriggers(sql),

    async renewLease(runId, workerId, epoch, leaseMs) {
      // Not renewed because the worker itself let go (settled, parked, handed back) is not a loss:
      // only a claim at a higher epoch is.
      const [row] = await sql.run(renewLeaseStatement, { runId, workerId, epoch, leaseMs });
      return row?.renewed === true || row?.taken !== true;
    },

    observationLog: (fence, invocationId) => observationLog(sql, fence, invocationId),

    release: (fence, summary) =>
      sql.transaction(async (trx) => {
        const released = await trx.run(releaseStatement, fence);
        if (released.length === 0) throw new LeaseLostError(fence.runId, fence.epoch);
        await appendRunEvents(trx, fence.runId, [{ kind: "status_changed", status: "queued", summary }]);
      }),
  };
}

/**
 * One call's observations, numbered here. The first takes its seq in its own insert (1, or the
 * next block after what a re-attached call already has: no extra round trip); the others follow
 * it in the order they were appended, each waiting only for the first's seq, so a stream keeps
 * several writes in flight.
 */
function observationLog(sql: Sql, fence: Fence, invocationId: string): ObservationLog {
  const { runId, workerId, epoch } = fence;
  // No row stored: the lease is gone, or (a bug, which the call's foreign key used to catch) the call is not this run's.
  const fencedOut = async (): Promise<never> => {
    const [call] = await sql.run(callOfRun, { runId, invocationId });
    if (call === undefined) throw new Error(`an observation names tool call ${invocationId}, which run ${runId} does not have`);
    throw new LeaseLostError(runId, epoch);
  };
  let appended = 0;
  let firstSeq: Promise<number> | undefined;
  return {
    append(stream, text) {
      const offset = appended++;
      // Bytes go as a binary parameter, which for a text column is the UTF-8 itself (the server
      // checks it): no string is built here, nor encoded again by the driver.
      const value = typeof text === "string" || Buffer.isBuffer(text) ? text : Buffer.from(text.buffer, text.byteOffset, text.byteLength);
      const params = { id: randomUUID(), runId, workerId, epoch, invocationId, stream, text: value };
      if (firstSeq === undefined) {
        firstSeq = sql.run(appendFirstObservation, params).then(async ([row]) => (row === undefined ? fencedOut() : Number(row.seq)));
        return firstSeq.then(() => undefined);
      }
      return firstSeq.then(async (first) => {
        const [stored] = await sql.run(appendObservation, { ...params, seq: first + offset });
        if (stored === undefined) await fencedOut();
      });
    },
  };
}

/**
 * Joined into an observation's insert: no row (nothing stored) once the claim's lease is gone, nor
 * for a call the run does not have (observations carry no foreign key to their call).
 */
const heldLease = fragment<ObservationParams>`runs r JOIN tool_invocations i ON i.id = ${invocation}::uuid AND i.run_id = r.id
  WHERE r.id = ${runId}::uuid AND r.lease_epoch = ${(p) => p.epoch}::bigint AND r.lease_owner = ${(p) => p.workerId}::text`;

const callOfRun = statement<{ runId: string; invocationId: string }, { id: string }>("observation_call_of_run")`
  SELECT id FROM tool_invocations WHERE id = ${invocation}::uuid AND run_id = ${runId}::uuid`;

/**
 * One streamed observation, committed asynchronously (synchronous_commit off for this
 * transaction only) in both durability modes, so a stream's rows do not wait for a WAL flush each. Nothing is weakened: WAL is flushed in order, so no later commit (the
 * exec's outcome, its step, anything a connector is told) is durable without every observation
 * before it. Only a PostgreSQL or machine crash can lose the last fraction of a second of rows,
 * and then together with everything committed after them: an exec whose outcome is not in the
 * ledger, which recovery treats as interrupted (a read) or unknown (a write) as it would anyway.
 */
const appendObservation = statement<ObservationParams & { seq: number }, { seq: number }>("observation_append")`
  WITH durability AS (SELECT set_config('synchronous_commit', 'off', true))
  INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text)
  SELECT ${(p) => p.id}::uuid, ${runId}::uuid, ${invocation}::uuid, ${(p) => p.seq}::int, ${(p) => p.stream}::text, ${(p) => p.text}::text
  FROM durability, ${heldLease}
  RETURNING seq`;

/**
 * A log's numbers: a fresh call's start at 1; a log on a call that already has observations (a
 * re-attach after its worker was fenced out) starts at the next block of OBSERVATION_BLOCK, after
 * everything observed so far. A fenced-out worker still streaming stays inside its own block, so
 * two logs of one call never take the same number, however many times the call is re-attached.
 */
const OBSERVATION_BLOCK = 1 << 20;

/** The same, as the log's first, numbered as above; returns the seq it took. */
const appendFirstObservation = statement<ObservationParams, { seq: number }>("observation_append_first")`
  WITH durability AS (SELECT set_config('synchronous_commit', 'off', true))
  INSERT INTO observations (id, run_id, tool_invocation_id, seq, stream, text)
  SELECT ${(p) => p.id}::uuid, ${runId}::uuid, ${invocation}::uuid,
    (SELECT coalesce((max(o.seq) / ${raw(String(OBSERVATION_BLOCK))} + 1) * ${raw(String(OBSERVATION_BLOCK))}, 1)
     FROM observations o WHERE o.tool_invocation_id = ${invocation}::uuid),
    ${(p) => p.stream}::text, ${(p) => p.text}::text
  FROM durability, ${heldLease}
  RETURNING seq`;

interface ObservationParams {
  readonly id: string;
  readonly runId: string;
  readonly workerId: string;
  readonly epoch: number;
  readonly invocationId: string;
  readonly stream: string;
  readonly text: string | Buffer;
}
