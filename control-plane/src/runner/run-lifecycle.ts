// The ack lifecycle between ⏳ and the mark, and the usage of model calls made beside the loop.
// The port is the ledger's (ledger/model-call.repository.ts); the per-run state lives here so the
// run session needs no field of its own.
import type { EmissionDraft } from "../domain/records.js";
import { ClaimNotStarted } from "../domain/run-start.js";
import { lifecycleAckDrafts } from "../domain/settlement.js";
import { ZERO_SIDE_USAGE, type SideCallUsage } from "../domain/triage.js";
import type { RunSession } from "./run-session.js";

export interface RunLifecycle {
  /**
   * Reserves lifecycle acks for a run still held at `epoch` and not settled, by idempotency key
   * (a key already reserved is skipped), in its own transaction. Returns the run's side usage.
   */
  reserveAcks(runId: string, epoch: number, drafts: readonly EmissionDraft[]): Promise<SideCallUsage>;
  /** The usage of the run's fast- and decision-model calls so far. */
  sideUsage(runId: string): Promise<SideCallUsage>;
}

interface TurnState {
  /** The started/thinking acks' reservation, made once per claim; settled before any later commit. */
  acks?: Promise<void>;
}

const states = new WeakMap<RunSession, TurnState>();

/**
 * Called as a model call starts: the first of a claim reserves STARTED and THINKING (at most once
 * per logical request: a retried claim or a superseding run finds the keys reserved); later calls
 * take the side usage the last commit returned, or read it when the store gave none. Neither is
 * waited for before the call; the result is awaited after it.
 */
export function beginModelCall(session: RunSession): Promise<SideCallUsage> {
  const lifecycle = session.deps.lifecycle;
  const { claimed } = session;
  // A WorkGraph child sends no acks of its own (its root's request has them) and makes no side calls.
  if (lifecycle === undefined || claimed.parentRunId !== undefined) return Promise.resolve(ZERO_SIDE_USAGE);
  let state = states.get(session);
  if (state === undefined) {
    state = {};
    states.set(session, state);
  }
  const log = (error: unknown): SideCallUsage => {
    // An early start the ceiling withdrew: the run is queued, and its claim sends the acks later.
    if (error instanceof ClaimNotStarted) return ZERO_SIDE_USAGE;
    session.deps.log.warn({ err: error, runId: claimed.runId }, "lifecycle acks or side usage could not be read; going on without");
    return ZERO_SIDE_USAGE;
  };
  if (state.acks === undefined && claimed.startAcksReserved === true) {
    // Admission reserved them with the run, a moment ago: no side call can have been recorded
    // against it but its own triage or a follow-up's decision, which the step commit reads back.
    state.acks = Promise.resolve();
    return Promise.resolve(ZERO_SIDE_USAGE);
  }
  if (state.acks === undefined) {
    const drafts = lifecycleAckDrafts(session.audience(), ["started", "thinking"]);
    const reserved = lifecycle.reserveAcks(claimed.runId, claimed.epoch, drafts).catch(log);
    state.acks = reserved.then(() => {});
    return reserved;
  }
  // The last commit read it back (and a side call since signals a control change, re-read
  // before the next turn): no round trip before the call's budget check.
  const known = session.control.sideUsage;
  return known !== undefined ? Promise.resolve(known) : lifecycle.sideUsage(claimed.runId).catch(log);
}
