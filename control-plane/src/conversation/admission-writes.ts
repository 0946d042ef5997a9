// How each decided plan is written: which runs, triggers, stops and acks it takes.
import { randomUUID } from "node:crypto";
import { coalesceUntil, type AdmissionPlan } from "../domain/interrupt.js";
import { PARKED_STATUSES, ZERO_USAGE, type RunStatus } from "../domain/run.js";
import { ackKey, lifecycleAckDrafts, WORKING_ACK } from "../domain/settlement.js";
import type { TranscriptProgress } from "../domain/transcript-builder.js";
import { hasFastModel, NO_FAST_MODEL_TRIAGE } from "../domain/triage.js";
import type { ClaimedRun } from "../runner/run-store.js";
import type { ConversationAddress, ConversationLedger, ConversationRun, IncomingMessage, NewRunDraft, RunStopDraft, StartClaim, TriggerDraft } from "./admission-ledger.js";
import type { Admission } from "./ingress.js";

/** A conversation's fixed facts for one attempt. */
export interface Mailroom extends ConversationAddress {
  readonly ledger: ConversationLedger;
  readonly now: Date;
  /** The conversation's latest progress notices, when admission read them with its runs. */
  readonly earlierProgress?: readonly TranscriptProgress[];
}

export const withNote = (why: string, note: string | undefined): string => (note === undefined ? why : `${why} (${note})`);

const isParked = (status: RunStatus): boolean => (PARKED_STATUSES as readonly RunStatus[]).includes(status);

const relationOf = (incoming: Pick<IncomingMessage, "relationLabel">): "edit" | "initial" => (incoming.relationLabel === "edit" ? "edit" : "initial");

type RunInsert = Omit<NewRunDraft, "notBefore" | "ack"> & { readonly ack?: { readonly messageId: string; readonly actorId: string } };

/** A root run with its triggers, first event and (for a new logical request) its working ack. */
async function insertRun(room: Mailroom, run: RunInsert): Promise<boolean> {
  const { ack: acked, ...rest } = run;
  const ack = acked === undefined ? undefined : { ...acked, text: WORKING_ACK, idempotencyKey: ackKey(run.logicalRequestId, "working") };
  return room.ledger.insertRun(
    room,
    { ...rest, notBefore: coalesceUntil(room.agent.interrupt, run.requestReceivedAt, room.now), ...(ack === undefined ? {} : { ack }) },
    room.now,
  );
}

/**
 * A request of its own: a fresh logical request, acked on its message. With a claim the run is
 * started for the reserved worker when the ceilings allow; returns whether it was. Without a fast
 * model its triage is the defaults, written with it: no second statement after the admission.
 */
export async function insertNewRequest(room: Mailroom, incoming: IncomingMessage, why: string, runId: string, claim?: StartClaim): Promise<boolean> {
  return insertRun(room, {
    runId,
    connector: incoming.connector,
    requesterId: incoming.actorId,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    requestReceivedAt: room.now,
    interruptions: 0,
    trigger: { incoming, relation: relationOf(incoming) },
    summary: `message ${incoming.externalId} from ${incoming.actorId}: ${why}`,
    ack: { messageId: incoming.externalId, actorId: incoming.actorId },
    // A started run's worker would reserve these as its model call starts, in a transaction of its own.
    ...(claim === undefined ? {} : { claim, startAcks: lifecycleAckDrafts({ logicalRequestId: runId, replyToMessageId: incoming.externalId, addressedActorIds: [incoming.actorId] }, START_ACKS) }),
    ...(hasFastModel(room.agent) ? {} : { triage: NO_FAST_MODEL_TRIAGE }),
  });
}

/** The acks a started run has from the moment it starts (domain/settlement.ts). */
const START_ACKS = ["started", "thinking"] as const;

/**
 * The run insertNewRequest starts for a worker, as the worker gets it: all known before the run
 * is written (a fresh run has one trigger, no steps and nothing inherited), its start acks
 * reserved with it.
 */
export function freshClaim(
  room: Pick<Mailroom, "agent" | "conversationId" | "now" | "earlierProgress">,
  incoming: Omit<IncomingMessage, "rowId">,
  runId: string,
): ClaimedRun {
  return {
    runId,
    epoch: 1,
    agent: room.agent,
    connector: incoming.connector,
    status: "queued",
    stepCount: 0,
    usage: ZERO_USAGE,
    startedAt: room.now,
    cancelRequestedByActorId: undefined,
    supersededByRunId: undefined,
    messages: [{ messageId: incoming.externalId, actorId: incoming.actorId, text: incoming.text, relation: relationOf(incoming), afterStep: 0, inherited: false }],
    triggerCount: 1,
    requestedByActorId: incoming.actorId,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    commitBoundary: "buffering",
    inheritsFromRunId: undefined,
    conversationId: room.conversationId,
    startAcksReserved: true,
    ...(room.earlierProgress === undefined ? {} : { earlierProgress: room.earlierProgress }),
  };
}

/** Joins a pending run (coalescing) or amends a running one at its next step boundary. */
export async function addTrigger(room: Mailroom, run: ConversationRun, incoming: IncomingMessage, how: TriggerDraft, why: string): Promise<Admission> {
  await room.ledger.addTrigger(run.id, incoming, how, room.now);
  await room.ledger.attachMessage(run.id, incoming.rowId);
  await room.ledger.appendEvents(run.id, [
    { kind: "trigger_added", summary: `message ${incoming.externalId} from ${incoming.actorId} ${how.amends ? "amends the run at its next step" : "joins the run"}: ${why}` },
  ]);
  room.ledger.wakeWorkers(run.id);
  return { runId: run.id, status: run.status, duplicate: false };
}

/** Stops a run: at once when no worker holds it, else at the holder's next safe point. */
async function stopRun(room: Mailroom, stop: RunStopDraft, pendingSummary: string): Promise<boolean> {
  if (isParked(stop.run.status)) {
    await room.ledger.stopParkedRun(room, stop);
    return true;
  }
  await room.ledger.requestStop(stop);
  await room.ledger.appendEvents(stop.run.id, [{ kind: "status_changed", status: stop.run.status, summary: pendingSummary }]);
  return false;
}

/**
 * The run stops and a successor takes over the same logical request: every trigger so far, the
 * new message, the completed work it inherits, and the request's ack, which is not repeated.
 */
export async function supersede(room: Mailroom, run: ConversationRun, incoming: IncomingMessage, why: string): Promise<Admission> {
  const successorId = randomUUID();
  await insertRun(room, {
    runId: successorId,
    connector: run.connector,
    requesterId: run.requestedByActorId,
    replyToMessageId: run.replyToMessageId ?? incoming.externalId,
    logicalRequestId: run.logicalRequestId,
    requestReceivedAt: run.requestReceivedAt,
    interruptions: run.interruptions + 1,
    inheritsFromRunId: run.id,
    carryTriggersOf: run.id,
    moveCarriedMessages: true,
    trigger: { incoming, relation: incoming.relationLabel },
    summary: `supersedes run ${run.id}: message ${incoming.externalId} from ${incoming.actorId}: ${why}`,
  });
  const reason = `superseded by run ${successorId} after message ${incoming.externalId} from ${incoming.actorId}`;
  const addressed = run.actorIds.length > 0 ? run.actorIds : [run.requestedByActorId];
  await stopRun(room, { run, actorId: incoming.actorId, reason, addressedActorIds: addressed, supersededBy: successorId }, `${reason}; stops at its next safe point`);
  return { runId: successorId, status: "queued", duplicate: false };
}

/** "never mind, stop": the message is recorded on the run it stops. */
export async function cancelByMessage(room: Mailroom, run: ConversationRun, incoming: IncomingMessage, why: string): Promise<Admission> {
  const reason = `message ${incoming.externalId}: ${why}`;
  await room.ledger.addCancelTrigger(run.id, incoming, reason, room.now);
  await room.ledger.attachMessage(run.id, incoming.rowId);
  const addressed = [...new Set([...(run.actorIds.length > 0 ? run.actorIds : [run.requestedByActorId]), incoming.actorId])];
  const stopped = await stopRun(
    room,
    { run, actorId: incoming.actorId, reason, addressedActorIds: addressed },
    `cancellation requested by ${incoming.actorId} (message ${incoming.externalId}): ${why}`,
  );
  room.ledger.wakeWorkers(run.id);
  return { runId: run.id, status: stopped ? "cancelled" : run.status, duplicate: false };
}

/**
 * One fresh, bounded run with the exhausted run's task context: its triggers and the work it
 * completed, then the requester's yes. A unique index makes a second continuation impossible.
 */
export async function continueExhausted(room: Mailroom, run: ConversationRun, incoming: IncomingMessage, why: string): Promise<Admission> {
  const runId = randomUUID();
  await insertRun(room, {
    runId,
    connector: run.connector,
    requesterId: run.requestedByActorId,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    requestReceivedAt: room.now,
    interruptions: 0,
    inheritsFromRunId: run.id,
    continuationOfRunId: run.id,
    carryTriggersOf: run.id,
    trigger: { incoming, relation: "continues" },
    summary: `continues run ${run.id}, authorized by ${incoming.actorId} (message ${incoming.externalId}): ${why}`,
    ack: { messageId: incoming.externalId, actorId: incoming.actorId },
  });
  await room.ledger.appendEvents(run.id, [{ kind: "trigger_added", summary: `continued as run ${runId}: ${incoming.actorId} authorized one fresh run` }]);
  return { runId, status: "queued", duplicate: false };
}

/** Writes a decided plan. */
export async function applyPlan(room: Mailroom, plan: AdmissionPlan, incoming: IncomingMessage, runs: readonly ConversationRun[], note: string | undefined): Promise<Admission> {
  const why = withNote("why" in plan ? plan.why : "", note);
  const byId = (id: string): ConversationRun => {
    const run = runs.find((r) => r.id === id);
    if (run === undefined) throw new Error(`run ${id} is not in the conversation it was planned against`);
    return run;
  };
  const edit = incoming.relationLabel === "edit";
  switch (plan.kind) {
    case "new_request": {
      const runId = randomUUID();
      await insertNewRequest(room, incoming, why, runId);
      // A connector is told the run was queued whether or not a worker took it in the same
      // commit: what it sees does not depend on this process's idle workers.
      return { runId, status: "queued", duplicate: false };
    }
    case "join":
      return addTrigger(room, byId(plan.runId), incoming, { relation: edit ? "edit" : plan.coalesced ? "coalesced" : "refines", notBefore: plan.notBefore, amends: false }, why);
    case "amend":
      return addTrigger(room, byId(plan.runId), incoming, { relation: edit ? "edit" : "amends", notBefore: undefined, amends: true }, why);
    case "supersede":
      return supersede(room, byId(plan.runId), incoming, why);
    case "cancel":
      return cancelByMessage(room, byId(plan.runId), incoming, why);
    case "continue":
      return continueExhausted(room, byId(plan.exhaustedRunId), incoming, why);
    case "record": {
      const run = byId(plan.runId);
      await room.ledger.attachMessage(run.id, incoming.rowId);
      await room.ledger.appendEvents(run.id, [{ kind: "trigger_added", summary: `message ${incoming.externalId} from ${incoming.actorId}: ${why}` }]);
      room.ledger.wakeWorkers(run.id);
      return { runId: run.id, status: run.status, duplicate: false };
    }
    case "needs_relation":
    case "needs_consent":
      throw new Error(`plan ${plan.kind} cannot be applied`);
  }
}
