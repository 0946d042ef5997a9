// Edits of a message already admitted, and replies that continue a run that ran out of budget.
import { randomUUID } from "node:crypto";
import { FailedPreconditionError, NotFoundError, PermissionDeniedError } from "../domain/errors.js";
import { planAdmission } from "../domain/interrupt.js";
import type { ConversationLedger, FollowUpLedger, IncomingMessage } from "./admission-ledger.js";
import { applyPlan, continueExhausted, type Mailroom } from "./admission-writes.js";
import { conversationState } from "./conversation-state.js";
import type { Admission, AdmissionAnswers, AdmissionAttempt, Continuation, ContinuationRequest, MessageEdit } from "./ingress.js";

type Ledger = ConversationLedger & FollowUpLedger;

/**
 * An edit is a message of its own (every version stays in the ledger) and, while a run that
 * carries the message is in flight, a refinement of it by definition: no model is asked.
 */
export async function admitEdit(ledger: Ledger, edit: MessageEdit, now: Date): Promise<Admission> {
  const address = await ledger.lockConversation(edit.agentId, edit.conversationId);
  if (address === undefined) throw new NotFoundError("message", edit.messageId);
  const original = await ledger.originalMessage(address.conversationId, edit.messageId);
  if (original === undefined) throw new NotFoundError("message", edit.messageId);
  if (original.actorId !== edit.actorId) {
    throw new PermissionDeniedError(`actor: ${edit.actorId} may not edit message ${edit.messageId}, which ${original.actorId} wrote`);
  }
  const current = async (runId: string | undefined): Promise<Admission> => {
    if (runId === undefined) throw new FailedPreconditionError(`message ${edit.messageId} belongs to no run`);
    return { runId, status: await ledger.runStatus(runId), duplicate: true };
  };
  // An edit that changes nothing (a retried call) is a no-op.
  if (original.latestText === edit.text) return current((await ledger.latestVersionRunId(original)) ?? original.runId);

  const externalId = `${edit.messageId}#edit-${original.edits + 1}`;
  const rowId = await ledger.storeEdit(address.conversationId, original, { externalId, actorId: edit.actorId, text: edit.text }, now);
  const { runs, earlierProgress } = await ledger.conversationRuns(address.agent.id, address.externalConversationId);
  const room: Mailroom = { ...address, ledger, now, earlierProgress };
  const incoming: IncomingMessage = { rowId, externalId, actorId: edit.actorId, connector: original.connector, text: edit.text, relationLabel: "edit" };
  const carrying = await ledger.runsCarrying(original);
  const { state } = conversationState(runs, (run) => carrying.has(run.id));
  if (state.target === undefined) {
    // Nothing in flight carries the message: the edit is recorded against the run that answered it.
    await ledger.attachMessage(original.runId, rowId);
    if (original.runId !== undefined) {
      await ledger.appendEvents(original.runId, [{ kind: "trigger_added", summary: `message ${edit.messageId} edited by ${edit.actorId} after the run ended; nothing restarted` }]);
    }
    return current(original.runId);
  }
  const plan = planAdmission({
    state: { target: state.target, exhausted: undefined },
    actorId: edit.actorId,
    scope: address.agent.interrupt.scope,
    settings: address.agent.interrupt,
    now,
    relation: "refines",
  });
  return applyPlan(room, plan, incoming, runs, `edit of message ${edit.messageId}`);
}

/** ContinueRun: only the requester's clear yes (the decision model's reading) authorizes one fresh run. */
export async function admitContinuation(
  ledger: Ledger,
  request: ContinuationRequest,
  answers: AdmissionAnswers,
  now: Date,
): Promise<AdmissionAttempt<Continuation>> {
  const run = await ledger.continuableRun(request.runId);
  if (run === undefined) throw new NotFoundError("run", request.runId);
  if (run.status !== "budget_exhausted" || !run.isRoot) {
    throw new FailedPreconditionError(`run ${request.runId} is ${run.status}; only a root run that ran out of budget can be continued`);
  }
  const existing = await ledger.continuationOf(request.runId);
  if (existing !== undefined) {
    if (request.messageId !== undefined && existing.externalMessageId === request.messageId) {
      return { kind: "done", result: { runId: existing.runId, authorized: true } };
    }
    throw new FailedPreconditionError(`run ${request.runId} was already continued as run ${existing.runId}; one yes authorizes one run`);
  }
  if (request.actorId !== run.requestedByActorId) {
    await ledger.appendEvents(run.id, [
      { kind: "trigger_added", summary: `${request.actorId} asked to continue, but only the requester ${run.requestedByActorId} may; nothing authorized` },
    ]);
    return { kind: "done", result: { runId: run.id, authorized: false } };
  }
  const consent = answers.consent?.runId === run.id ? answers.consent : undefined;
  if (consent === undefined) return { kind: "needs_consent", agent: run.address.agent, runId: run.id };
  if (consent.answer !== "yes") {
    await ledger.appendEvents(run.id, [
      { kind: "trigger_added", summary: `continuation not authorized: ${request.actorId} answered ${consent.answer}${consent.note === undefined ? "" : ` (${consent.note})`}` },
    ]);
    return { kind: "done", result: { runId: run.id, authorized: false } };
  }
  const externalId = request.messageId ?? `continue-${randomUUID()}`;
  const rowId = await ledger.storeReply(run.address.conversationId, request.actorId, externalId, request.text);
  const room: Mailroom = { ...run.address, ledger, now };
  const admission = await continueExhausted(
    room,
    run,
    { rowId, externalId, actorId: request.actorId, connector: run.connector, text: request.text, relationLabel: "refines" },
    "authorized through ContinueRun",
  );
  return { kind: "done", result: { runId: admission.runId, authorized: true } };
}
