// What a message does to the run already in its conversation.
//
// The mailbox asks these questions in order: may this actor touch the run at all (the agent's
// interrupt scope); what does the message mean for it (the fast model's relation); what does
// the run's state allow (the downgrade matrix: work past the commit boundary is never
// restarted); and has the request used up its interrupts (the starvation bound). Everything
// here is a pure function of its arguments, so every combination is a row in a table test.
import type { InterruptScope, InterruptSettings } from "./agent.js";
import type { ToolInvocationStatus } from "./records.js";
import type { CommitBoundary, Replayability } from "./run.js";

// --- The fast model's answer ------------------------------------------------------------

export const FOLLOW_UP_RELATIONS = ["refines", "independent", "cancels"] as const;
export type FollowUpRelation = (typeof FOLLOW_UP_RELATIONS)[number];

/**
 * Used when the fast model is slow, fails, or answers off the list. "independent" queues the
 * message as a request of its own: nothing already done is thrown away and nothing stops. A
 * wrong "refines" would restart work; a wrong "cancels" would stop a request nobody withdrew.
 */
export const FOLLOW_UP_FALLBACK: FollowUpRelation = "independent";

/** How long ingress waits for a fixed-choice answer before it takes the fallback. */
export const FOLLOW_UP_DECISION_TIMEOUT_MS = 5_000;

export function followUpQuestion(request: string, followUp: string): string {
  return [
    "An agent is working on this request from a conversation:",
    quoted(request),
    "This message then arrived in the same conversation:",
    quoted(followUp),
    "Is the new message a refinement of the request in progress (a correction, a constraint or more detail for the same task), " +
      "an independent request, or a request to cancel the one in progress?",
    "Answer with exactly one word: refines, independent or cancels.",
  ].join("\n\n");
}

// --- The configured intent and the state that may downgrade it -----------------------

/** What the policy would like to do with a follow-up before the run's state has its say. */
export type FollowUpIntent = "supersede" | "amend" | "queue" | "cancel";

const INTENT: Readonly<Record<FollowUpRelation, FollowUpIntent>> = { refines: "supersede", independent: "queue", cancels: "cancel" };

export function intentOf(relation: FollowUpRelation): FollowUpIntent {
  return INTENT[relation];
}

/**
 * Where the run a follow-up targets is. `pending`: admitted but not yet started (coalescing or
 * waiting its turn). `buffering`: started, nothing external done yet. `committed`: an
 * externally effectful step has happened.
 */
export type RunPhase = "pending" | "buffering" | "committed";

export function phaseOf(run: { readonly started: boolean; readonly commitBoundary: CommitBoundary }): RunPhase {
  if (!run.started) return "pending";
  return run.commitBoundary === "committed" ? "committed" : "buffering";
}

/**
 * What actually happens. `join`: the message becomes another trigger of a run that has not
 * started. `supersede`: the run stops at its next safe point and a successor that inherits its
 * completed work starts with the message added. `amend`: the message reaches the running run
 * at its next step boundary. `queue`: a request of its own, behind the current one. `cancel`:
 * stop (at once if nothing holds the run, else at its next safe point). `stop_with_partial`:
 * cancel a committed run, replying with what it already did.
 */
export type FollowUpBehaviour = "join" | "supersede" | "amend" | "queue" | "cancel" | "stop_with_partial";

/**
 * The downgrade matrix, read as intent x phase. A pending run has nothing to interrupt, so a
 * refinement simply joins it. Past the commit boundary a run may only finish or stop with a
 * partial result: a refinement that would restart it is folded in at the next step instead, and
 * a cancel says what was already done.
 */
const MATRIX: Readonly<Record<RunPhase, Readonly<Record<FollowUpIntent, FollowUpBehaviour>>>> = {
  pending: { supersede: "join", amend: "join", queue: "queue", cancel: "cancel" },
  buffering: { supersede: "supersede", amend: "amend", queue: "queue", cancel: "cancel" },
  committed: { supersede: "amend", amend: "amend", queue: "queue", cancel: "stop_with_partial" },
};

/**
 * The behaviour the run's state allows for an intent. Once the starvation bound closes a
 * started run to interrupts, refinements no longer reach it; they queue behind it so the user's
 * words are still answered. A cancel is always honoured: stopping cannot starve anyone.
 */
export function allowedBehaviour(intent: FollowUpIntent, phase: RunPhase, interruptsOpen: boolean): FollowUpBehaviour {
  const allowed = MATRIX[phase][intent];
  if (!interruptsOpen && phase !== "pending" && (allowed === "supersede" || allowed === "amend")) return "queue";
  return allowed;
}

// --- Whose interrupt counts ----------------------------------------------------------

export interface RunAudience {
  /** Who asked: the actor of the logical request's first message. */
  readonly requesterId: string;
  /** Whom the run is answering: the actors of its triggers and anyone who answered its questions. */
  readonly addressedActorIds: readonly string[];
}

/**
 * same_actor_only: only the requester may change the run. thread_scoped: anyone in the
 * conversation may. addressed_actor_only: only someone the agent is currently answering.
 */
export function interruptCounts(scope: InterruptScope, audience: RunAudience, actorId: string): boolean {
  switch (scope) {
    case "same_actor_only":
      return actorId === audience.requesterId;
    case "thread_scoped":
      return true;
    case "addressed_actor_only":
      return actorId === audience.requesterId || audience.addressedActorIds.includes(actorId);
  }
}

// --- The starvation bound --------------------------------------------------------------

export interface InterruptHistory {
  /** Supersessions and amendments the logical request has already taken. */
  readonly interruptions: number;
  /** When its first message arrived (the clock's time). */
  readonly requestReceivedAt: Date;
}

/** Interrupts are accepted until the request has taken its maximum or its wall-clock ceiling passes. */
export function interruptsOpen(settings: InterruptSettings, history: InterruptHistory, now: Date): boolean {
  return (
    history.interruptions < settings.maxSupersessions &&
    now.getTime() - history.requestReceivedAt.getTime() < settings.supersessionCeilingMs
  );
}

// --- One follow-up ---------------------------------------------------------------------

export interface FollowUpSituation extends InterruptHistory {
  readonly relation: FollowUpRelation;
  readonly actorId: string;
  readonly scope: InterruptScope;
  readonly settings: InterruptSettings;
  readonly phase: RunPhase;
  readonly audience: RunAudience;
  readonly now: Date;
  /** The run waits on a WorkGraph that is still running. */
  readonly graphRunning?: boolean;
}

export interface FollowUpDecision {
  readonly behaviour: FollowUpBehaviour;
  /** For the run's event log: why this behaviour and not the intent's. */
  readonly why: string;
}

/** Relation, whose-interrupt policy, starvation bound and commit boundary, combined. */
export function decideFollowUp(situation: FollowUpSituation): FollowUpDecision {
  const intent = intentOf(situation.relation);
  if (!interruptCounts(situation.scope, situation.audience, situation.actorId)) {
    return { behaviour: "queue", why: `${situation.relation}, but under ${situation.scope} ${situation.actorId} may not change this run; queued as its own request` };
  }
  const open = interruptsOpen(situation.settings, situation, situation.now);
  const behaviour = allowedBehaviour(intent, situation.phase, open);
  const expected = MATRIX[situation.phase][intent];
  if (behaviour !== expected) return { behaviour, why: `${situation.relation} while ${situation.phase}; the starvation bound is reached, so the run takes no more interrupts` };
  // A graph is revised around its finished nodes rather than restarted: the refinement amends its
  // root, whose next scheduler pass stops the unstarted part and asks the root to plan again.
  if (situation.graphRunning === true && intent === "supersede" && (behaviour === "supersede" || behaviour === "amend")) {
    return { behaviour: "amend", why: `${situation.relation} while its work graph runs: the graph is revised around the nodes already done` };
  }
  const downgraded = behaviour !== MATRIX.buffering[intent];
  return { behaviour, why: `${situation.relation} while ${situation.phase}${downgraded ? ` (${intent} downgraded to ${behaviour})` : ""}` };
}

// --- Coalescing ------------------------------------------------------------------------

/** A run that has not started and whose quiet period has not ended takes new messages as triggers. */
export function inCoalesceWindow(run: { readonly started: boolean; readonly notBefore: Date }, now: Date): boolean {
  return !run.started && now.getTime() < run.notBefore.getTime();
}

/**
 * When a run may start: the window after the latest message, so a burst becomes one run. A
 * steady drip of messages cannot hold it back forever: the start is capped at the first
 * message plus the larger of the window and the interrupt ceiling.
 */
export function coalesceUntil(settings: InterruptSettings, requestReceivedAt: Date, now: Date): Date {
  const latest = requestReceivedAt.getTime() + Math.max(settings.coalesceWindowMs, settings.supersessionCeilingMs);
  return new Date(Math.min(now.getTime() + settings.coalesceWindowMs, latest));
}

// --- Continuation consent --------------------------------------------------------------

export const CONSENT_ANSWERS = ["yes", "no", "unclear"] as const;
export type ConsentAnswer = (typeof CONSENT_ANSWERS)[number];

/** A slow, failed or off-list answer authorizes nothing. */
export const CONSENT_FALLBACK: ConsentAnswer = "unclear";

export function consentQuestion(reply: string): string {
  return [
    "An agent ran out of its budget before finishing a task and asked whether to continue with a fresh budget. The person who asked for the task replied:",
    quoted(reply),
    "Is that reply a clear yes to continuing, a no, or unclear?",
    "Answer with exactly one word: yes, no or unclear.",
  ].join("\n\n");
}

/** Exactly one case authorizes a fresh run: the original requester, clearly saying yes. */
export function continuationAuthorized(input: { readonly answer: ConsentAnswer; readonly actorId: string; readonly requesterId: string }): boolean {
  return input.answer === "yes" && input.actorId === input.requesterId;
}

// --- Admission of one message ----------------------------------------------------------

/** The run follow-ups in a conversation are measured against, as the ledger last saw it. */
export interface TargetRun extends InterruptHistory {
  readonly runId: string;
  readonly started: boolean;
  readonly notBefore: Date;
  readonly commitBoundary: CommitBoundary;
  /** It waits on a WorkGraph that is still running. */
  readonly graphRunning?: boolean;
  readonly audience: RunAudience;
}

export interface ConversationState {
  /** The request in progress (its pending successor when superseded), else the newest pending run. */
  readonly target: TargetRun | undefined;
  /** The newest root run, when it ended budget_exhausted, nothing came after it, and it was not continued. */
  readonly exhausted: { readonly runId: string; readonly requesterId: string } | undefined;
}

export type AdmissionPlan =
  | { readonly kind: "new_request"; readonly why: string }
  /** `coalesced`: inside the window, where no question is asked; else a refinement of a run still waiting to start. */
  | { readonly kind: "join"; readonly runId: string; readonly notBefore: Date; readonly coalesced: boolean; readonly why: string }
  | { readonly kind: "supersede"; readonly runId: string; readonly why: string }
  | { readonly kind: "amend"; readonly runId: string; readonly why: string }
  | { readonly kind: "cancel"; readonly runId: string; readonly partial: boolean; readonly why: string }
  | { readonly kind: "continue"; readonly exhaustedRunId: string; readonly why: string }
  | { readonly kind: "record"; readonly runId: string; readonly why: string }
  /** Ask the fast model how the message relates to this run, then plan again. */
  | { readonly kind: "needs_relation"; readonly runId: string }
  /** Ask the decision model whether the requester's message is consent, then plan again. */
  | { readonly kind: "needs_consent"; readonly runId: string };

export interface AdmissionInput {
  readonly state: ConversationState;
  readonly actorId: string;
  readonly scope: InterruptScope;
  readonly settings: InterruptSettings;
  readonly now: Date;
  /** Known up front for an edit (always a refinement), or once the fast model answered. */
  readonly relation?: FollowUpRelation;
  readonly consent?: ConsentAnswer;
}

/**
 * Decides what one incoming message does. Only the two model questions are left to the
 * caller, and only when the answer could change the outcome: a message inside the coalesce
 * window simply joins, and one from an actor whose interrupts do not count is queued without
 * asking anything.
 */
export function planAdmission(input: AdmissionInput): AdmissionPlan {
  const target = input.state.target;
  if (target !== undefined) {
    if (!interruptCounts(input.scope, target.audience, input.actorId)) {
      return { kind: "new_request", why: `under ${input.scope} ${input.actorId} may not change run ${target.runId}; queued as its own request` };
    }
    // A window of 0 coalesces nothing: a message whose clock reading predates the target's
    // start time only because it waited for the conversation's lock is a follow-up like any other.
    if (input.settings.coalesceWindowMs > 0 && inCoalesceWindow(target, input.now)) {
      return {
        kind: "join",
        runId: target.runId,
        notBefore: coalesceUntil(input.settings, target.requestReceivedAt, input.now),
        coalesced: true,
        why: "arrived inside the coalesce window",
      };
    }
    if (input.relation === undefined) return { kind: "needs_relation", runId: target.runId };
    const decision = decideFollowUp({
      relation: input.relation,
      actorId: input.actorId,
      scope: input.scope,
      settings: input.settings,
      phase: phaseOf(target),
      audience: target.audience,
      graphRunning: target.graphRunning === true,
      interruptions: target.interruptions,
      requestReceivedAt: target.requestReceivedAt,
      now: input.now,
    });
    switch (decision.behaviour) {
      case "join":
        return { kind: "join", runId: target.runId, notBefore: target.notBefore, coalesced: false, why: decision.why };
      case "supersede":
        return { kind: "supersede", runId: target.runId, why: decision.why };
      case "amend":
        return { kind: "amend", runId: target.runId, why: decision.why };
      case "queue":
        return { kind: "new_request", why: decision.why };
      case "cancel":
        return { kind: "cancel", runId: target.runId, partial: false, why: decision.why };
      case "stop_with_partial":
        return { kind: "cancel", runId: target.runId, partial: true, why: decision.why };
    }
  }
  const exhausted = input.state.exhausted;
  if (exhausted !== undefined) {
    if (input.actorId !== exhausted.requesterId) {
      return { kind: "new_request", why: `only ${exhausted.requesterId} may authorize continuing run ${exhausted.runId}; a new request` };
    }
    if (input.consent === undefined) return { kind: "needs_consent", runId: exhausted.runId };
    switch (input.consent) {
      case "yes":
        return { kind: "continue", exhaustedRunId: exhausted.runId, why: "the requester said yes to continuing" };
      case "no":
        return { kind: "record", runId: exhausted.runId, why: "the requester declined to continue" };
      case "unclear":
        return { kind: "new_request", why: "not a clear answer to the continuation question; a new request without the saved context" };
    }
  }
  return { kind: "new_request", why: "nothing in flight in this conversation" };
}

// --- Inheriting completed work ---------------------------------------------------------

export interface InheritableStep {
  readonly replayability: Replayability;
  readonly invocations: readonly {
    readonly status: ToolInvocationStatus;
    readonly refusalReason: string | undefined;
    readonly resolvedOutcome: "applied" | "not_applied" | undefined;
  }[];
}

/**
 * The completed work a successor starts from: the longest prefix of steps whose every call has
 * a real result. A call cut short by the stop itself (pending, interrupted, refused with "not
 * run: ...", an outcome nobody settled) ends the prefix, so the successor never sees half a
 * step. A superseding run takes only replayable steps; a continuation takes effects too, as
 * history it must not redo.
 */
export function inheritablePrefix<T extends InheritableStep>(steps: readonly T[], mode: "replayable_only" | "all_settled"): T[] {
  const kept: T[] = [];
  for (const step of steps) {
    if (mode === "replayable_only" && step.replayability !== "replayable") break;
    const settled = step.invocations.every((call) => {
      switch (call.status) {
        case "succeeded":
        case "failed":
          return true;
        case "refused":
          return !(call.refusalReason ?? "").startsWith("not run:");
        case "unknown_outcome":
          return call.resolvedOutcome !== undefined;
        case "pending":
        case "interrupted":
          return false;
      }
    });
    if (!settled) break;
    kept.push(step);
  }
  return kept;
}

// --- Replies --------------------------------------------------------------------------

/**
 * What a committed run says when it is stopped: it may not pretend nothing happened, so it
 * names the effects that already took place and were not undone.
 */
export function partialResultReply(input: { readonly stoppedBy: string; readonly stepsDone: number; readonly effects: readonly string[] }): string {
  const lines = [`I stopped before finishing, as ${input.stoppedBy} asked.`, ""];
  const steps = input.stepsDone === 1 ? "1 step" : `${input.stepsDone} steps`;
  if (input.effects.length === 0) {
    lines.push(`Done before stopping: ${steps}.`);
  } else {
    lines.push(`Done before stopping: ${steps}. These changes were already made and were not undone:`);
    for (const effect of input.effects.slice(0, 8)) lines.push(`- ${effect}`);
    if (input.effects.length > 8) lines.push(`- …and ${input.effects.length - 8} more`);
  }
  return lines.join("\n");
}

function quoted(text: string): string {
  return text
    .split("\n")
    .map((line) => `> ${line}`)
    .join("\n");
}
