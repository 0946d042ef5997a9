// Recovery of a claimed run whose previous worker stopped mid-step. A read it never finished
// is marked interrupted (the model may ask again); a write's outcome is unknown and is never
// replayed: the tool's own lookup may settle it, else the run waits for an operator.
import { randomUUID } from "node:crypto";
import type { RunStatus } from "../domain/run.js";
import type { RegisteredTool } from "../tools/tool-registry.js";
import type { InvocationState } from "./run-store.js";
import { parkForInput } from "./run-settlement.js";
import { CONTINUE, PARK, type Next, type RunSession } from "./run-session.js";

/** Loads the committed history and settles every call a dead worker left open; `continue` means the loop may go on. */
export async function recover(session: RunSession): Promise<Next> {
  await session.loadHistory();
  const invocations = session.history.steps.flatMap((step) => step.invocations);
  const pending = invocations.filter((i) => i.status === "pending");
  const unresolved = invocations.filter((i) => i.status === "unknown_outcome" && i.resolvedOutcome === undefined);
  if (pending.length === 0 && unresolved.length === 0) return CONTINUE;
  let waiting = unresolved.length > 0;
  for (const [i, invocation] of pending.entries()) {
    const tool = session.deps.tools.get(invocation.toolName);
    const last = i === pending.length - 1;
    if (tool?.definition.parksForInput === true) return parkForInput(session, invocation);
    const waitReason = last && waiting ? { waitReason: "unknown_write_outcome" as const } : {};
    if (await reattach(session, tool, invocation, afterRecovery(last, waiting), last && waiting)) continue;
    if (invocation.effect === "read") {
      await session.settleTool(invocation, "interrupted", afterRecovery(last, waiting), {
        summary: `${invocation.toolName} interrupted by a worker restart`,
        ...waitReason,
      });
      continue;
    }
    const looked = await lookup(session, tool, invocation);
    if (looked !== "unknown") {
      await session.settleTool(invocation, "unknown_outcome", afterRecovery(last, waiting), {
        summary: `${invocation.toolName}: lookup found it ${looked}`,
        resolvedOutcome: looked,
        ...waitReason,
      });
      continue;
    }
    waiting = true;
    await session.settleTool(invocation, "unknown_outcome", last ? "waiting" : "awaiting_tool", {
      summary: `${invocation.toolName}: outcome unknown after a worker stopped; waiting for an operator`,
      ...(last ? { waitReason: "unknown_write_outcome" as const } : {}),
    });
  }
  if (!waiting) {
    await session.loadHistory();
    return CONTINUE;
  }
  if (pending.length === 0) {
    await session.store.commitStep({
      ...session.fence,
      step: undefined,
      status: "waiting",
      waitReason: "unknown_write_outcome",
      usage: session.usage,
      emissions: [],
      summary: "an unknown write outcome is still unresolved",
    });
  }
  return PARK;
}

/**
 * The run's status after recovery settles one pending call: the last one leaves the run
 * waiting when any write's outcome is still unknown (an earlier call in this loop, or from
 * before), else running. Anything but "waiting" there would keep the lease with no worker
 * behind it, and the run would sit until the lease expired and another worker recovered it.
 */
function afterRecovery(last: boolean, waiting: boolean): RunStatus {
  if (!last) return "awaiting_tool";
  return waiting ? "waiting" : "running";
}

/** Commits the real outcome of a call whose execution outlived its worker, if the tool can still see it. */
async function reattach(session: RunSession, tool: RegisteredTool | undefined, invocation: InvocationState, status: RunStatus, waitingAfter: boolean): Promise<boolean> {
  if (tool?.definition.reattach === undefined) return false;
  const { claimed, context, deps } = session;
  let result;
  try {
    result = await tool.definition.reattach(JSON.parse(invocation.argumentsJson) as Record<string, unknown>, {
      runId: claimed.runId,
      invocationId: invocation.id,
      signal: context.signal,
      grant: deps.tools.grantFor(claimed.agent, invocation.toolName),
      agent: claimed.agent,
      leaseEpoch: claimed.epoch,
      observe: session.observe(invocation.id),
    });
  } catch (error) {
    if (context.signal.aborted) throw error;
    session.log.warn({ err: error, tool: invocation.toolName }, "re-attaching to a call failed; recovering it as if its worker died");
    return false;
  }
  if (result === undefined) return false;
  await session.commitToolOutcome({
    ...session.fence,
    invocationId: invocation.id,
    effect: invocation.effect,
    outcome: result.ok ? "succeeded" : "failed",
    resultText: result.text,
    artifacts: (result.artifacts ?? []).map((artifact) => ({ ...artifact, id: randomUUID() })),
    ...(result.exitCode === undefined ? {} : { exitCode: result.exitCode }),
    ...(result.truncated === undefined ? {} : { truncated: result.truncated }),
    ...(waitingAfter ? { waitReason: "unknown_write_outcome" as const } : {}),
    status,
    usage: session.usage,
    emissions: [],
    summary: `${invocation.toolName} re-attached after a restart: ${result.ok ? "succeeded" : "failed"}`,
  });
  return true;
}

async function lookup(session: RunSession, tool: RegisteredTool | undefined, invocation: InvocationState): Promise<"applied" | "not_applied" | "unknown"> {
  if (tool?.definition.lookup === undefined) return "unknown";
  const { claimed, context, deps } = session;
  try {
    return await tool.definition.lookup(JSON.parse(invocation.argumentsJson) as Record<string, unknown>, {
      runId: claimed.runId,
      invocationId: invocation.id,
      signal: context.signal,
      grant: deps.tools.grantFor(claimed.agent, invocation.toolName),
      agent: claimed.agent,
    });
  } catch (error) {
    session.log.warn({ err: error, tool: invocation.toolName }, "outcome lookup failed; leaving it to an operator");
    return "unknown";
  }
}
