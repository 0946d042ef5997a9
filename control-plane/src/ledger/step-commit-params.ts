// A fenced commit's parameters (step-commit.sql.ts): what one settlement carries, numbered and
// serialised for the statement, and how long its transaction waits for the WAL.
import { isTerminal, type RunStatus } from "../domain/run.js";
import type { Fence, Settlement } from "../runner/run-store.js";
import { emissionRows } from "./ledger-writes.js";
import type { FencedChange, FencedCommitParams } from "./step-commit.sql.js";

/** Statuses in which a worker keeps its lease. */
const HELD: ReadonlySet<RunStatus> = new Set(["running", "awaiting_tool"]);

/**
 * How long commits wait for the WAL. strict: every commit that records a step, a model call
 * (its usage and cost), a tool result, an artifact, a claim or an emission waits for its flush,
 * so nothing a run paid for or was told is lost in a database crash. relaxed: replayable work
 * (see mayCommitAsync) does not wait. In both, a stream's observation rows do not wait: the
 * exec's outcome commits after them and its flush covers them, as WAL is flushed in order.
 */
export type Durability = "strict" | "relaxed";

/**
 * Whether a relaxed commit may skip waiting for its WAL flush. Only work that is safe to lose
 * in a database crash qualifies: no emission (a connector may read a row before it is durable),
 * no write intent or outcome (intent before effect), no settled run. A later synchronous
 * commit flushes the WAL before it, so at worst a database crash forgets a replayable step
 * or a read's result, which recovery handles as it handles a dead worker; the model call is
 * then made again and its lost record's usage is not counted (README, "Durability").
 */
function mayCommitAsync(settlement: Settlement, writes: boolean): boolean {
  return !writes && settlement.emissions.length === 0 && HELD.has(settlement.status);
}

/** synchronous_commit for a transaction that is safe to lose in relaxed mode, and only there. */
export function replayableCommit(durability: Durability): "on" | "off" {
  return durability === "relaxed" ? "off" : "on";
}

/** The fenced commit's parameters for one settlement and what it carries. */
export function fencedCommitParams(fence: Fence, settlement: Settlement, change: FencedChange, durability: Durability): FencedCommitParams {
  const step = change.step;
  const call = step?.modelCall;
  const artifacts = change.outcomes.flatMap((outcome) => outcome.artifacts.map((artifact) => ({ ...artifact, invocationId: outcome.invocationId })));
  // The commit's events in order: each settled call's, those stored as rows, the step's, and the
  // status change last (numbered only when the status did change).
  const settledCount = change.outcomes.length;
  const eventCount = settledCount + change.events.length + (step === undefined ? 0 : 1);
  const events = [
    ...change.events.map((event, i) => ({ ...event, ord: settledCount + i, onlyOnChange: false })),
    { kind: "status_changed" as const, status: settlement.status, summary: settlement.summary, ord: eventCount, onlyOnChange: true },
  ];
  const keeps = HELD.has(settlement.status);
  return {
    runId: fence.runId,
    workerId: fence.workerId,
    epoch: fence.epoch,
    synchronousCommit: mayCommitAsync(settlement, change.writes) ? replayableCommit(durability) : "on",
    status: settlement.status,
    usage: JSON.stringify(settlement.usage),
    finalReply: settlement.finalReply ?? null,
    error: settlement.error ?? null,
    exhaustedDimension: settlement.exhaustedDimension ?? null,
    waitReason: settlement.waitReason ?? null,
    crossesCommitBoundary: change.crossesCommitBoundary,
    terminal: isTerminal(settlement.status),
    keepsLease: keeps,
    guarded: change.unlessChangedSince !== undefined,
    guardTriggerCount: change.unlessChangedSince?.triggerCount ?? null,
    hasStep: step !== undefined,
    stepId: step?.id ?? null,
    stepIndex: step?.index ?? null,
    replayability: step?.replayability ?? null,
    actorId: step?.actorId ?? null,
    feedback: step?.feedback ?? null,
    startedAt: step?.startedAt ?? null,
    callId: call?.id ?? null,
    role: call?.role ?? null,
    provider: call?.provider ?? null,
    model: call?.model ?? null,
    request: call === undefined ? null : (change.requestJson ?? JSON.stringify(call.request)),
    responseText: call?.responseText ?? null,
    toolCalls: call === undefined ? null : JSON.stringify(call.toolCalls),
    inputTokens: call?.inputTokens ?? null,
    outputTokens: call?.outputTokens ?? null,
    latencyMs: call?.latencyMs ?? null,
    finishReason: call?.finishReason ?? null,
    costMicroUsd: call?.costMicroUsd ?? null,
    intents: JSON.stringify(
      (step?.invocations ?? []).map((intent) => ({
        id: intent.id,
        provider_call_id: intent.providerCallId,
        ordinal: intent.ordinal,
        tool_name: intent.toolName,
        tool_version: intent.toolVersion,
        effect: intent.effect,
        arguments: asJsonb(intent.argumentsJson),
        status: intent.status,
        refusal_reason: intent.refusalReason ?? null,
      })),
    ),
    outcomes: JSON.stringify(
      change.outcomes.map((outcome, ord) => ({
        id: outcome.invocationId,
        outcome: outcome.outcome,
        result_text: outcome.resultText,
        refusal_reason: outcome.refusalReason ?? null,
        exit_code: outcome.exitCode ?? null,
        duration_ms: outcome.durationMs ?? null,
        truncated: outcome.truncated ?? false,
        answered_by: outcome.answeredByActorId ?? null,
        resolved_outcome: outcome.resolvedOutcome ?? null,
        event_ord: ord,
      })),
    ),
    outcomeIds: change.outcomes.map((outcome) => outcome.invocationId),
    artifacts: JSON.stringify(
      artifacts.map((artifact) => ({
        id: artifact.id,
        tool_invocation_id: artifact.invocationId,
        type: artifact.type,
        schema_version: artifact.schemaVersion,
        provenance: artifact.provenance,
        inline_data: artifact.inlineData ?? null,
        reference: artifact.reference ?? null,
        subject_artifact_id: artifact.subjectArtifactId ?? null,
        conclusion: artifact.conclusion ?? null,
      })),
    ),
    events: JSON.stringify(
      events.map((event) => ({
        ord: event.ord,
        kind: event.kind,
        status: event.status ?? null,
        step_id: event.stepId ?? null,
        tool_invocation_id: event.toolInvocationId ?? null,
        summary: event.summary,
        only_on_change: event.onlyOnChange,
      })),
    ),
    eventCount,
    stepEventSummary: step === undefined ? null : (change.stepSummary ?? null),
    emissions: emissionRows(settlement.emissions),
    // A run handed back (answered, resolved) wakes a worker; so does one that gives up its
    // worker slot (settled, parked) while others wait: one held back by its conversation or a
    // ceiling may go now. With nothing queued, no worker is woken for an empty claim.
    wakesWorker: settlement.status === "queued",
    freesSlot: !keeps,
    storesNoEvent: change.events.length === 0 && change.statusKept === true,
  };
}

/**
 * The arguments column is jsonb, but a refused call keeps what the model sent, which may not be
 * JSON at all ("the arguments are not valid JSON"): such text is stored as a JSON string.
 */
function asJsonb(argumentsJson: string): unknown {
  try {
    return JSON.parse(argumentsJson) as unknown;
  } catch {
    return argumentsJson;
  }
}
