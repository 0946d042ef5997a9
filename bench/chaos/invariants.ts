// What must hold after the chaos, read from the ledger, the effect log and the connector's
// stream. Each violation is counted under the name the table prints and described in a line.
import pg from "pg";
import type { EffectRecord } from "./effect-log.js";
import { isSettled, type Workload } from "./workload.js";

export interface InvariantReport {
  readonly runs: number;
  readonly byStatus: Readonly<Record<string, number>>;
  /** Effects recorded by the effect log (every attempt). */
  readonly effects: number;
  /** A key applied more than once, a run with more than one effect, an emission received twice or a second reply/settled ack for a run. */
  readonly duplicates: number;
  /** A write Keel records as done (succeeded, or looked up as applied) with no effect; a submitted run or a committed emission that never arrived. */
  readonly lost: number;
  /** An effect without an intent row, or an effect whose invocation Keel records as failed, interrupted or not applied. */
  readonly unintended: number;
  /** Not terminal nor waiting on an unknown outcome, and not leased for longer than stuckAfterMs. */
  readonly stuck: number;
  /** Not terminal nor waiting on an unknown outcome, but still leased (a worker holds it). */
  readonly unsettled: number;
  readonly unknownOutcomes: number;
  readonly writes: Readonly<Record<string, number>>;
  readonly execs: Readonly<Record<string, number>>;
  /** Why sandbox calls failed, by the start of their result text. */
  readonly execFailures: Readonly<Record<string, number>>;
  readonly problems: readonly string[];
}

export interface InvariantInput {
  readonly databaseUrl: string;
  readonly agentId: string;
  readonly effectTool: string;
  readonly connector: string;
  readonly effects: readonly EffectRecord[];
  readonly workload: Workload;
  readonly stuckAfterMs: number;
}

const count = <K extends string>(keys: readonly K[]): Record<K, number> => {
  const counts = {} as Record<K, number>;
  for (const key of keys) counts[key] = (counts[key] ?? 0) + 1;
  return counts;
};

export async function checkInvariants(input: InvariantInput): Promise<InvariantReport> {
  const db = new pg.Client({ connectionString: input.databaseUrl });
  await db.connect();
  try {
    const { rows: runs } = await db.query<{ id: string; status: string; wait_reason: string | null; leased: boolean; unleased_ms: number; lease: string }>(
      `SELECT id::text AS id, status, wait_reason, coalesce(lease_expires_at > now(), false) AS leased,
              coalesce(lease_owner, '-') || ' epoch ' || lease_epoch AS lease,
              (extract(epoch FROM now() - greatest(coalesce(lease_expires_at, updated_at), updated_at)) * 1000)::float8 AS unleased_ms
         FROM runs WHERE agent_id = $1`,
      [input.agentId],
    );
    const { rows: calls } = await db.query<{ id: string; run_id: string; tool_name: string; status: string; resolved_outcome: string | null; result_text: string | null; age_s: number }>(
      `SELECT t.id::text AS id, t.run_id::text AS run_id, t.tool_name, t.status, t.resolved_outcome, left(t.result_text, 160) AS result_text,
              extract(epoch FROM now() - t.created_at)::int AS age_s
         FROM tool_invocations t JOIN runs r ON r.id = t.run_id WHERE r.agent_id = $1`,
      [input.agentId],
    );
    const { rows: emissions } = await db.query<{ idempotency_key: string; run_id: string | null; kind: string; ack_state: string | null; seq: string }>(
      "SELECT idempotency_key, run_id::text AS run_id, kind, ack_state, seq::text AS seq FROM emissions WHERE connector = $1",
      [input.connector],
    );

    const problems: string[] = [];
    let duplicates = 0;
    let lost = 0;
    let unintended = 0;
    let stuck = 0;
    let unsettled = 0;
    const note = (line: string) => {
      if (problems.length < 50) problems.push(line);
    };

    // Runs: every one settled; every submitted one in the ledger.
    const runIds = new Set(runs.map((r) => r.id));
    for (const run of runs) {
      if (isSettled(run.status, run.wait_reason)) continue;
      if (!run.leased && run.unleased_ms > input.stuckAfterMs) {
        stuck += 1;
        note(`stuck: run ${run.id} ${run.status}${run.wait_reason === null ? "" : ` (${run.wait_reason})`}, unleased for ${Math.round(run.unleased_ms / 1000)} s`);
      } else {
        unsettled += 1;
        const open = calls.filter((c) => c.run_id === run.id && c.status === "pending").map((c) => `${c.tool_name} ${c.id} pending for ${c.age_s} s`);
        note(`unsettled: run ${run.id} ${run.status}${run.leased ? `, leased by ${run.lease}` : ""}${open.length === 0 ? "" : `; ${open.join(", ")}`}`);
      }
    }
    for (const runId of input.workload.runs.keys()) {
      if (!runIds.has(runId)) {
        lost += 1;
        note(`lost: run ${runId} was acknowledged by SubmitMessage but is not in the ledger`);
      }
    }

    // Writes to the effect log against their intent rows.
    const writes = calls.filter((c) => c.tool_name.startsWith(`${input.effectTool}.`));
    const byKey = new Map<string, EffectRecord[]>();
    for (const effect of input.effects) byKey.set(effect.key, [...(byKey.get(effect.key) ?? []), effect]);
    const intents = new Map(writes.map((w) => [w.id, w]));
    for (const [key, applied] of byKey) {
      if (applied.length > 1) {
        duplicates += applied.length - 1;
        note(`duplicate: effect key ${key} applied ${applied.length} times`);
      }
      const intent = intents.get(key);
      if (intent === undefined) {
        unintended += 1;
        note(`unintended: effect key ${key} (run ${applied[0]?.runId}) has no intent row`);
      } else if (intent.status !== "succeeded" && !(intent.status === "unknown_outcome" && intent.resolved_outcome !== "not_applied")) {
        unintended += 1;
        note(`unintended: effect key ${key} applied, but its invocation is ${intent.status}${intent.resolved_outcome === null ? "" : ` (${intent.resolved_outcome})`}`);
      }
    }
    for (const write of writes) {
      const done = write.status === "succeeded" || (write.status === "unknown_outcome" && write.resolved_outcome === "applied");
      if (done && !byKey.has(write.id)) {
        lost += 1;
        note(`lost: write ${write.id} of run ${write.run_id} is ${write.status}${write.resolved_outcome === null ? "" : ` (${write.resolved_outcome})`} but the effect log has no such key`);
      }
    }
    // The script posts once per run: two effects for one run are a replayed write under another key.
    for (const [runId, n] of Object.entries(count(input.effects.map((e) => e.runId)))) {
      if (n > 1) {
        duplicates += n - 1;
        note(`duplicate: run ${runId} applied ${n} effects (its script writes once)`);
      }
    }

    // Emissions: one reply and one settled ack per run in the ledger; every key received once; none missed.
    for (const [runId, n] of Object.entries(count(emissions.filter((e) => e.kind === "reply" && e.run_id !== null).map((e) => e.run_id!)))) {
      if (n > 1) {
        duplicates += n - 1;
        note(`duplicate: run ${runId} has ${n} reply emissions`);
      }
    }
    const settledAcks = emissions.filter((e) => e.kind === "ack" && (e.ack_state === "succeeded" || e.ack_state === "failed") && e.run_id !== null);
    for (const [runId, n] of Object.entries(count(settledAcks.map((e) => e.run_id!)))) {
      if (n > 1) {
        duplicates += n - 1;
        note(`duplicate: run ${runId} has ${n} settled acks`);
      }
    }
    for (const [key, n] of input.workload.received) {
      if (n > 1) {
        duplicates += n - 1;
        note(`duplicate: emission ${key} received ${n} times on the stream`);
      }
    }
    const cursor = input.workload.lastSeq();
    for (const emission of emissions) {
      if (BigInt(emission.seq) <= cursor && !input.workload.received.has(emission.idempotency_key)) {
        lost += 1;
        note(`lost: emission ${emission.idempotency_key} (seq ${emission.seq}) is behind the stream's cursor ${cursor} but never arrived`);
      }
    }
    const behind = emissions.filter((e) => BigInt(e.seq) > cursor).length;
    if (behind > 0) {
      lost += behind;
      note(`lost: ${behind} committed emissions never reached the stream (cursor ${cursor})`);
    }

    return {
      runs: runs.length,
      byStatus: count(runs.map((r) => (r.status === "waiting" && r.wait_reason !== null ? `waiting:${r.wait_reason}` : r.status))),
      effects: input.effects.length,
      duplicates,
      lost,
      unintended,
      stuck,
      unsettled,
      unknownOutcomes: writes.filter((w) => w.status === "unknown_outcome").length,
      writes: count(writes.map((w) => (w.resolved_outcome === null ? w.status : `${w.status}:${w.resolved_outcome}`))),
      execs: count(calls.filter((c) => c.tool_name.startsWith("sandbox.")).map((c) => `${c.tool_name.replace(/\.v\d+$/, "")}:${c.status}`)),
      execFailures: count(
        calls
          .filter((c) => c.tool_name.startsWith("sandbox.") && c.status !== "succeeded")
          .map((c) => `${c.status}: ${(c.result_text ?? "").replace(/[0-9a-f]{8}-[0-9a-f-]{27}/g, "<id>").replace(/\s+/g, " ").slice(0, 100)}`),
      ),
      problems,
    };
  } finally {
    await db.end();
  }
}
