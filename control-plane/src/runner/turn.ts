// One iteration of the loop: the profile's turn over the policy-filtered catalog, one model
// call, its validation, and the step committed with every call's intent before any is run.
import { randomUUID } from "node:crypto";
import type { ModelSpec } from "../domain/agent.js";
import { DEFAULT_MODEL_TIMEOUT_MS } from "../domain/agent.js";
import { budgetOverrun } from "../domain/budget.js";
import { compactToolResults, DEFAULT_COMPACTION } from "../domain/compaction.js";
import { DomainError } from "../domain/errors.js";
import { byteLength } from "../domain/ids.js";
import { requestForStorage } from "../domain/model-request.js";
import { evaluatorFor, profileFor } from "../domain/profile.js";
import { costMicroUsd } from "../domain/run.js";
import { buildTranscript, type TranscriptStep } from "../domain/transcript-builder.js";
import { withSideUsage } from "../domain/triage.js";
import type { ModelMessage, ModelTurn, ToolCallRequest } from "../domain/transcript.js";
import type { ModelRequest } from "../models/model-provider.js";
import type { RegisteredTool } from "../tools/tool-registry.js";
import type { InvocationIntent, StepCommit } from "./run-store.js";
import { beginModelCall } from "./run-lifecycle.js";
import { commitSettlement, exhaustionNote, settlementFor } from "./run-settlement.js";
import { CONTINUE, PARK, type Next, type RunSession, type StepDraft } from "./run-session.js";
import { dispatchCalls } from "./tool-dispatch.js";

type TurnStep = Omit<StepDraft, "replayability" | "invocations">;

/** Takes one turn: a reply settles (or, unfinished, is sent back), tool calls are committed and dispatched. */
export async function takeTurn(session: RunSession): Promise<Next> {
  const { claimed, deps } = session;
  const agent = claimed.agent;
  const history = session.history;
  const profile = profileFor(agent.profile.name, agent.profile.version);
  const catalog = deps.tools.catalogFor(agent, claimed.connector);
  const systemPrompt = [agent.systemPrompt, profile?.instructions() ?? ""].filter((s) => s.trim() !== "").join("\n\n");
  const transcript = buildTranscript({
    systemPrompt,
    requests: session.messages.filter((m) => !m.inherited),
    steps: history.steps,
    inherited: { requests: session.messages.filter((m) => m.inherited), steps: history.inherited },
    progress: history.progress,
    stepMessages: stepMessagesOf(session),
  });
  const refs = callRefs(session);
  const messages = compactToolResults(transcript, refs, deps.compaction ?? DEFAULT_COMPACTION);
  const tools = catalog.map((t) => t.spec);

  const spec = agent.models.primary;
  const startedAt = deps.now();
  // Fired as the call starts, awaited after it: the acks land before anything this turn commits.
  const beside = beginModelCall(session);
  const called = await callModel(session, spec, messages, tools);
  const side = await beside;
  if (called.kind !== "turn") return called;
  // Redacted before anything uses it: the step, the reply and the calls' arguments (so what runs
  // is what the ledger holds, and a replay after a crash runs the same) never carry a secret.
  const turn = session.redactor.turn(called.turn);
  const latencyMs = deps.now().getTime() - startedAt.getTime();
  const cost = costMicroUsd(turn.usage, spec.prices);
  session.usage = {
    ...session.usage,
    iterations: session.usage.iterations + 1,
    modelCalls: session.usage.modelCalls + 1,
    inputTokens: session.usage.inputTokens + turn.usage.inputTokens,
    outputTokens: session.usage.outputTokens + turn.usage.outputTokens,
    outputBytes: session.usage.outputBytes + byteLength(turn.text),
    costMicroUsd: session.usage.costMicroUsd + cost,
    wallClockMs: session.elapsed(),
  };
  const callId = randomUUID();
  const previousRequest = session.previousRequest;
  const request = requestForStorage(callId, { messages, tools }, previousRequest);
  session.previousRequest = request.remembered;
  // Stored requests are deltas on the one before: only the new messages need redacting.
  const storedRequest = session.redactor.active ? { ...request.stored, messages: request.stored.messages.map((m) => session.redactor.message(m as ModelMessage)) } : request.stored;
  const step: TurnStep = {
    id: randomUUID(),
    index: session.stepIndex,
    actorId: session.actorOfStep(),
    startedAt,
    modelCall: {
      id: callId,
      role: "primary",
      provider: spec.provider,
      model: spec.model === "" ? spec.provider : spec.model,
      request: storedRequest,
      responseText: turn.text,
      toolCalls: turn.toolCalls,
      inputTokens: turn.usage.inputTokens,
      outputTokens: turn.usage.outputTokens,
      latencyMs,
      finishReason: turn.finishReason,
      costMicroUsd: cost,
    },
  };
  session.stepIndex += 1;

  // Budgets count the fast- and decision-model calls made beside the loop too.
  const counted = withSideUsage(session.usage, side);
  if (turn.toolCalls.length === 0) {
    const overrun = budgetOverrun(agent.budget, counted, session.elapsed());
    const output = profile?.interpretOutput(turn.text) ?? { finalText: turn.text, proposed: undefined };
    const evaluator = profile === undefined ? undefined : evaluatorFor(profile.evaluator.name, profile.evaluator.version);
    const proposed = output.proposed === undefined ? [] : [{ id: "proposed", type: output.proposed.type, provenance: "model" as const, subjectArtifactId: undefined, conclusion: undefined }];
    const completion = evaluator?.evaluate({ finalText: output.finalText, artifacts: [...history.artifacts, ...proposed] }) ?? { complete: true as const };
    if (completion.complete || overrun !== undefined) {
      const reply: StepCommit = {
        ...session.fence,
        step: { ...step, replayability: "replayable", invocations: [] },
        ...settlementFor(session, "succeeded", { summary: "replied", replyText: output.finalText, finalReply: output.finalText }),
        // Over budget, the reply stands even if more input came: there is no budget left to answer it.
        unlessChangedSince: { triggerCount: overrun === undefined ? session.triggerCount : undefined },
      };
      const control = await commitSettlement(session, reply);
      if (control === undefined) return PARK;
      // Stopped, or given more input, while the model wrote this reply: nothing was committed.
      // The checkpoint handles it as if it had come a moment sooner (a stop ends the run; new
      // input goes to the model). The call still counts against the budget.
      session.control = control;
      session.stepIndex = step.index;
      session.previousRequest = previousRequest;
      return CONTINUE;
    }
    const feedback = `Your reply does not complete the task yet (${profile?.evaluator.name} v${profile?.evaluator.version}): ${completion.missing}`;
    return commitInvalid(session, step, [], feedback);
  }

  const intents = turn.toolCalls.map((call, ordinal) => validate(session, call, ordinal, catalog));
  const overrun = budgetOverrun(agent.budget, counted, session.elapsed());
  if (overrun !== undefined) {
    const refused = intents.map((intent) => ({ ...intent, status: "refused" as const, refusalReason: `not run: ${exhaustionNote(overrun)}` }));
    return { kind: "exhaust", check: overrun, step: { ...step, replayability: "replayable", invocations: refused } };
  }
  const pending = intents.filter((intent) => intent.status === "pending");
  if (pending.length === 0) return commitInvalid(session, step, intents, "None of your tool calls could run; see each call's result for why.");
  session.invalidTurns = 0;
  const effectful = pending.some((intent) => intent.effect === "write");
  await session.commitStep({
    ...session.fence,
    step: { ...step, replayability: effectful ? "not_replayable" : "replayable", invocations: intents },
    crossesCommitBoundary: effectful,
    status: "awaiting_tool",
    usage: session.usage,
    emissions: [],
    summary: `${pending.length} tool call(s) to dispatch`,
  });
  return dispatchCalls(session, pending);
}

const stepMessagesBySession = new WeakMap<RunSession, WeakMap<TranscriptStep, readonly ModelMessage[]>>();

/** The session's built step messages (buildTranscript's stepMessages): each turn builds only new or settled steps. */
function stepMessagesOf(session: RunSession): WeakMap<TranscriptStep, readonly ModelMessage[]> {
  let built = stepMessagesBySession.get(session);
  if (built === undefined) {
    built = new WeakMap();
    stepMessagesBySession.set(session, built);
  }
  return built;
}

interface CallRefs {
  readonly inherited: RunSession["history"]["inherited"];
  steps: number;
  readonly refs: Record<string, string>;
}

const refsBySession = new WeakMap<RunSession, CallRefs>();

/**
 * Each tool call id the transcript shows, mapped to the ledger id compaction points at (a later
 * call reusing an id wins). Steps only grow within a claim and a step's ids never change, so
 * only the steps committed since the last turn are added: no walk of the whole history per turn.
 */
function callRefs(session: RunSession): Readonly<Record<string, string>> {
  const { inherited, steps } = session.history;
  let cached = refsBySession.get(session);
  if (cached === undefined || cached.inherited !== inherited || cached.steps > steps.length) {
    // No prototype: a call id such as "__proto__" is a key like any other, as with Object.fromEntries.
    cached = { inherited, steps: 0, refs: Object.create(null) as Record<string, string> };
    for (const step of inherited) for (const invocation of step.invocations) cached.refs[invocation.providerCallId] = invocation.id;
    refsBySession.set(session, cached);
  }
  for (; cached.steps < steps.length; cached.steps++) {
    for (const invocation of steps[cached.steps]!.invocations) cached.refs[invocation.providerCallId] = invocation.id;
  }
  return cached.refs;
}

/** Records a turn the model got wrong and tells it why; too many in a row fail the run. */
async function commitInvalid(session: RunSession, step: TurnStep, intents: readonly InvocationIntent[], feedback: string): Promise<Next> {
  session.invalidTurns += 1;
  const invalid: StepDraft = { ...step, replayability: "replayable", invocations: intents, feedback };
  if (session.invalidTurns >= session.deps.maxInvalidTurns) {
    return {
      kind: "settle",
      status: "failed",
      step: invalid,
      outcome: {
        summary: `${session.invalidTurns} invalid model turns in a row`,
        error: `the model made ${session.invalidTurns} invalid turns in a row; last problem: ${feedback}`,
        replyText: `Sorry, I could not finish this: the model kept producing turns that could not be used (${feedback}).`,
      },
    };
  }
  await session.commitStep({ ...session.fence, step: invalid, status: "running", usage: session.usage, emissions: [], summary: `invalid turn: ${feedback}` });
  return CONTINUE;
}

/** The tool exists in this run's catalog and its arguments parse against its schema. */
function validate(session: RunSession, call: ToolCallRequest, ordinal: number, catalog: readonly RegisteredTool[]): InvocationIntent {
  const at = call.name.lastIndexOf(".");
  const toolVersion = at < 0 ? "" : call.name.slice(at + 1);
  const base = { id: randomUUID(), providerCallId: call.id, ordinal, toolName: call.name, toolVersion, argumentsJson: call.argumentsJson };
  const refuse = (reason: string): InvocationIntent => ({ ...base, effect: "read", status: "refused", refusalReason: reason });
  const tool = catalog.find((t) => t.fullName === call.name);
  if (tool === undefined) {
    return refuse(`there is no tool ${JSON.stringify(call.name)} in this run; available: ${catalog.map((t) => t.fullName).join(", ") || "none"}`);
  }
  let parsed: unknown;
  try {
    parsed = call.argumentsJson.trim() === "" ? {} : JSON.parse(call.argumentsJson);
  } catch (error) {
    return refuse(`the arguments are not valid JSON (${(error as Error).message})`);
  }
  const checked = tool.schema.safeParse(parsed);
  if (!checked.success) {
    const problems = checked.error.issues.map((issue) => `${issue.path.join(".") || "(arguments)"}: ${issue.message}`).join("; ");
    return refuse(`the arguments do not match the schema of ${tool.fullName}: ${problems}`);
  }
  const args = checked.data;
  const tools = session.deps.tools;
  return { ...base, argumentsJson: JSON.stringify(args), effect: tools.effectOf(tool, args, tools.grantFor(session.claimed.agent, tool.fullName)), status: "pending" };
}

/**
 * One model call, cut short by the worker's shutdown, the model's timeout or the run's wall
 * clock. A provider failure ends the run (failed, or exhausted when the wall clock cut it).
 */
async function callModel(
  session: RunSession,
  spec: ModelSpec,
  messages: ModelRequest["messages"],
  tools: ModelRequest["tools"],
): Promise<{ readonly kind: "turn"; readonly turn: ModelTurn } | Exclude<Next, { kind: "continue" }>> {
  const { claimed, context } = session;
  const provider = session.deps.providers[spec.provider];
  const remaining = Math.max(1, claimed.agent.budget.maxWallClockMs - session.elapsed());
  const modelTimeoutMs = spec.timeoutMs > 0 ? spec.timeoutMs : DEFAULT_MODEL_TIMEOUT_MS;
  // One controller per call, aborted by the worker's shutdown or the call's timeout (cheaper
  // than AbortSignal.any and AbortSignal.timeout, which every iteration would pay for).
  const call = new AbortController();
  let timedOut = false;
  const stop = () => call.abort(context.signal.reason);
  context.signal.addEventListener("abort", stop, { once: true });
  const timer = setTimeout(() => {
    timedOut = true;
    call.abort(new DOMException("the model call timed out", "TimeoutError"));
  }, Math.min(modelTimeoutMs, remaining));
  const began = performance.now();
  try {
    if (context.signal.aborted) stop();
    const request = { spec, messages, tools, callIndex: session.usage.modelCalls, signal: call.signal };
    const tracing = session.deps.tracing;
    const turn = await (tracing === undefined ? provider.complete(request) : tracing.modelCall(claimed.runId, spec, () => provider.complete(request)));
    return { kind: "turn", turn };
  } catch (error) {
    if (context.signal.aborted || !(error instanceof DomainError)) throw error;
    session.usage = { ...session.usage, modelCalls: session.usage.modelCalls + 1, wallClockMs: session.elapsed() };
    if (timedOut && remaining < modelTimeoutMs) {
      // The run's wall clock, not the model's own timeout, cut the call short: the budget ran out.
      const limit = claimed.agent.budget.maxWallClockMs;
      return { kind: "exhaust", check: { exhausted: "wall_clock", limit, used: Math.max(limit, session.elapsed()) } };
    }
    return {
      kind: "settle",
      status: "failed",
      outcome: {
        summary: `model call failed: ${error.message}`,
        error: error.message,
        replyText: `Sorry, I could not finish this: the model call failed (${error.message}).`,
      },
    };
  } finally {
    clearTimeout(timer);
    context.signal.removeEventListener("abort", stop);
    session.deps.latencies?.record("model_call", performance.now() - began, spec.provider);
  }
}
