// The calls of a committed step, one by one: authorized again with the control state as of
// the last commit, run, and their results committed. A call whose outcome is lost settles
// as interrupted (a read: the step goes on) or unknown (a write: the run waits).
import { randomUUID } from "node:crypto";
import { budgetBeforeToolCall } from "../domain/budget.js";
import { byteLength } from "../domain/ids.js";
import { mayDispatch } from "../domain/policy.js";
import type { RunStatus } from "../domain/run.js";
import { ToolOutcomeUnknownError } from "../tools/tool-registry.js";
import type { InvocationIntent } from "./run-store.js";
import { exhaustionNote, parkForInput } from "./run-settlement.js";
import { CONTINUE, PARK, type Next, type RunSession } from "./run-session.js";

/** Runs the step's pending calls in order until one ends the step early. */
export async function dispatchCalls(session: RunSession, pending: readonly InvocationIntent[]): Promise<Next> {
  for (const [i, intent] of pending.entries()) {
    const next = await dispatch(session, intent, pending.slice(i + 1));
    if (next.kind !== "continue") return next;
  }
  return CONTINUE;
}

/** Authorize again with the policy as it is now, then run the call and commit its result. */
async function dispatch(session: RunSession, intent: InvocationIntent, rest: readonly InvocationIntent[]): Promise<Next> {
  const after: RunStatus = rest.length === 0 ? "running" : "awaiting_tool";
  const { claimed, context, deps } = session;
  const control = session.control;
  if (control.cancelRequestedByActorId !== undefined) {
    const successor = control.supersededByRunId;
    const why = successor === undefined ? `cancelled by ${control.cancelRequestedByActorId}` : `superseded by run ${successor}`;
    await session.refuseAll([intent, ...rest], "not run: cancelled", `not run: the run was ${why}`);
    return successor === undefined ? { kind: "cancel", actorId: control.cancelRequestedByActorId } : { kind: "supersede", successorId: successor };
  }
  const check = budgetBeforeToolCall(claimed.agent.budget, session.usage, session.elapsed());
  if (check !== undefined) {
    await session.refuseAll([intent, ...rest], "not run: budget", `not run: ${exhaustionNote(check)}`);
    return { kind: "exhaust", check };
  }
  const tool = deps.tools.get(intent.toolName);
  const args = JSON.parse(intent.argumentsJson) as Record<string, unknown>;
  if (tool === undefined) {
    const reason = `tool ${intent.toolName} is no longer registered`;
    await session.settleTool(intent, "refused", after, { summary: `refused at dispatch: ${reason}`, refusalReason: reason });
    return CONTINUE;
  }
  const decision = mayDispatch(control.policy, { fullName: intent.toolName, effect: intent.effect }, args);
  if (!decision.allowed) {
    await session.settleTool(intent, "refused", after, { summary: `refused at dispatch: ${decision.reason}`, refusalReason: decision.reason });
    return CONTINUE;
  }
  if (tool.definition.parksForInput === true) {
    await session.refuseAll(
      rest,
      "not run: waiting for an answer",
      "not run: the run stopped to wait for an answer to keel.ask_user; call it again afterwards if still needed",
    );
    return parkForInput(session, intent);
  }

  const started = deps.now().getTime();
  const began = performance.now();
  let outcome: "succeeded" | "failed";
  let result;
  try {
    const execution = {
      runId: claimed.runId,
      invocationId: intent.id,
      signal: context.signal,
      grant: deps.tools.grantFor(claimed.agent, intent.toolName),
      agent: claimed.agent,
      leaseEpoch: claimed.epoch,
      observe: session.observe(intent.id),
    };
    const tracing = deps.tracing;
    result = await (tracing === undefined
      ? tool.definition.execute(args, execution)
      : tracing.toolCall(claimed.runId, intent, () => tool.definition.execute(args, execution)));
    outcome = result.ok ? "succeeded" : "failed";
  } catch (error) {
    if (context.signal.aborted) throw error; // shutting down mid-call: recovery decides on resume
    if (error instanceof ToolOutcomeUnknownError) return outcomeLost(session, intent, rest, error.message);
    result = { ok: false, text: `The tool failed: ${error instanceof Error ? error.message : String(error)}` };
    outcome = "failed";
  } finally {
    deps.latencies?.record("tool_call", performance.now() - began, intent.toolName);
  }
  // Parked by the tool itself (keel.propose_work_graph): the call stays pending until the graph ends.
  if ("parked" in result && result.parked === true) return PARK;
  session.usage = {
    ...session.usage,
    toolCalls: session.usage.toolCalls + 1,
    outputBytes: session.usage.outputBytes + byteLength(result.text),
    wallClockMs: session.elapsed(),
  };
  await session.commitToolOutcome({
    ...session.fence,
    invocationId: intent.id,
    effect: intent.effect,
    outcome,
    resultText: result.text,
    durationMs: deps.now().getTime() - started,
    artifacts: (result.artifacts ?? []).map((artifact) => ({ ...artifact, id: randomUUID() })),
    ...(result.exitCode === undefined ? {} : { exitCode: result.exitCode }),
    ...(result.truncated === undefined ? {} : { truncated: result.truncated }),
    status: after,
    usage: session.usage,
    emissions: [],
    summary: `${intent.toolName} ${outcome}`,
  });
  return CONTINUE;
}

/**
 * The call's executor lost track of it (its host vanished): a read is interrupted and the
 * step goes on; a write's outcome is unknown, the calls after it are not run, and the run
 * waits for a lookup or an operator.
 */
async function outcomeLost(session: RunSession, intent: InvocationIntent, rest: readonly InvocationIntent[], why: string): Promise<Next> {
  if (intent.effect === "read") {
    await session.settleTool(intent, "interrupted", rest.length === 0 ? "running" : "awaiting_tool", { summary: `${intent.toolName} interrupted: ${why}` });
    return CONTINUE;
  }
  await session.refuseAll(rest, "not run: an earlier call's outcome is unknown", "not run: an earlier call in this turn has an unknown outcome");
  await session.settleTool(intent, "unknown_outcome", "waiting", {
    summary: `${intent.toolName}: outcome unknown (${why}); waiting for an operator`,
    waitReason: "unknown_write_outcome",
  });
  return PARK;
}
