// How a claim ends: the phases return what happens next, and what ends the run (a settlement,
// an exhausted budget, a cancellation, a supersession) is committed here with the notices
// domain/settlement.ts drafts.
import { exhaustionReply, type BudgetCheck } from "../domain/budget.js";
import type { RunStatus } from "../domain/run.js";
import { cancellationReply, questionDraft, refusedReply, settlementDrafts } from "../domain/settlement.js";
import type { InvocationState, RunControlState, Settlement, StepCommit } from "./run-store.js";
import { PARK, type Next, type RunSession, type SettleOutcome, type StepDraft } from "./run-session.js";

/** The run's terminal status with its reply and the ack that replaces the hourglass. */
export function settlementFor(session: RunSession, status: RunStatus, unredacted: SettleOutcome): Settlement {
  session.usage = { ...session.usage, wallClockMs: session.elapsed() };
  // Every reply, error and ack of a run's end is built here: the one place they are redacted.
  const outcome = redactedOutcome(session, unredacted);
  return {
    status,
    usage: session.usage,
    // A WorkGraph child has no voice in the conversation: its reply is its node's result.
    emissions: session.claimed.parentRunId === undefined ? settlementDrafts(session.audience(), status, outcome.replyText) : [],
    summary: outcome.summary,
    ...(outcome.finalReply === undefined ? {} : { finalReply: outcome.finalReply }),
    ...(outcome.error === undefined ? {} : { error: outcome.error }),
  };
}

function redactedOutcome(session: RunSession, outcome: SettleOutcome): SettleOutcome {
  const { redactor } = session;
  if (!redactor.active) return outcome;
  return {
    summary: redactor.text(outcome.summary),
    ...(outcome.replyText === undefined ? {} : { replyText: redactor.text(outcome.replyText) }),
    ...(outcome.finalReply === undefined ? {} : { finalReply: redactor.text(outcome.finalReply) }),
    ...(outcome.error === undefined ? {} : { error: redactor.text(outcome.error) }),
  };
}

export function exhaustionSettlement(session: RunSession, check: BudgetCheck): Settlement {
  const steps = session.history.steps;
  const reply = exhaustionReply({
    check,
    request: session.messages.map((m) => m.text).join("\n"),
    stepsDone: steps.length,
    toolCallsDone: steps.flatMap((s) => s.invocations).filter((i) => i.status === "succeeded").map((i) => i.toolName),
  });
  const settlement = settlementFor(session, "budget_exhausted", { summary: `budget exhausted: ${check.exhausted}`, replyText: reply, finalReply: reply });
  return { ...settlement, exhaustedDimension: check.exhausted };
}

export function exhaustionNote(check: BudgetCheck): string {
  return `the run's ${check.exhausted.replace("_", " ")} budget is used up`;
}

/** Commits what ends the run, when `next` ends it; `continue` and `park` have nothing left to commit. */
export async function finish(session: RunSession, next: Next): Promise<void> {
  switch (next.kind) {
    case "continue":
    case "park":
      return;
    case "settle":
      return commitEnd(session, next.step, settlementFor(session, next.status, next.outcome));
    case "exhaust":
      return commitEnd(session, next.step, exhaustionSettlement(session, next.check));
    case "supersede":
      // Without a reply or an ack: the successor answers the same request and settles its ack.
      session.usage = { ...session.usage, wallClockMs: session.elapsed() };
      return commitEnd(session, undefined, { status: "cancelled", usage: session.usage, emissions: [], summary: `superseded by run ${next.successorId}` });
    case "cancel": {
      // Past the commit boundary a stop must say what was already done; before it, the failed ack says enough.
      const actorId = next.actorId;
      const reply = cancellationReply(session.commitBoundary, actorId, () => ({ stepsDone: session.history.steps.length, effects: session.effectsDone() }));
      const outcome =
        reply === undefined
          ? { summary: `cancelled by ${actorId}` }
          : { summary: `cancelled by ${actorId} past the commit boundary; partial result sent`, replyText: reply, finalReply: reply };
      return commitEnd(session, undefined, settlementFor(session, "cancelled", outcome));
    }
  }
}

async function commitEnd(session: RunSession, step: StepDraft | undefined, settlement: Settlement): Promise<void> {
  await commitSettlement(session, { ...session.fence, step, ...settlement });
}

/**
 * Commits a step that ends the run, unless the ledger refuses it for input that came meanwhile
 * (`unlessChangedSince`), and tells `runEnded` when it did end it. Every end a worker commits goes
 * here. Returns the run's control state when the end was refused, undefined when the run ended.
 */
export async function commitSettlement(session: RunSession, commit: StepCommit): Promise<RunControlState | undefined> {
  const control = await session.store.commitStep(commit);
  if (refusedReply(commit.unlessChangedSince, control)) return control;
  session.deps.runEnded?.(session.claimed.runId, commit.status);
  return undefined;
}

/** Asks the conversation the call's question and parks the run until someone answers. */
export async function parkForInput(session: RunSession, invocation: Pick<InvocationState, "id" | "argumentsJson">): Promise<Next> {
  const asked = (JSON.parse(invocation.argumentsJson) as { question?: unknown }).question;
  const question = typeof asked === "string" ? asked : asked === undefined || asked === null ? "" : JSON.stringify(asked);
  await session.store.commitStep({
    ...session.fence,
    step: undefined,
    status: "awaiting_input",
    usage: session.usage,
    emissions: [questionDraft(session.audience(), invocation.id, session.redactor.text(question))],
    summary: "asked the conversation a question",
  });
  return PARK;
}
