import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import type { ModelProviderName, ModelSpec } from "../domain/agent.js";
import { DEFAULT_MODEL_TIMEOUT_MS } from "../domain/agent.js";
import { budgetBeforeModelCall, budgetBeforeToolCall, budgetOverrun, exhaustionReply, type BudgetCheck } from "../domain/budget.js";
import { compactToolResults, DEFAULT_COMPACTION, type CompactionOptions } from "../domain/compaction.js";
import { DomainError } from "../domain/errors.js";
import { byteLength } from "../domain/ids.js";
import { mayDispatch } from "../domain/policy.js";
import { evaluatorFor, profileFor } from "../domain/profile.js";
import { costMicroUsd, type CommitBoundary, type RunStatus, type RunUsage } from "../domain/run.js";
import { cancellationReply, questionDraft, refusedReply, settlementDrafts } from "../domain/settlement.js";
import { requestForStorage, type PreviousModelRequest } from "../domain/model-request.js";
import { buildTranscript } from "../domain/transcript-builder.js";
import type { ModelTurn, ToolCallRequest } from "../domain/transcript.js";
import { ToolOutcomeUnknownError, type RegisteredTool, type ToolRegistry } from "../tools/tool-registry.js";
import type { ModelProvider } from "../models/model-provider.js";
import { batchReadOutcomes, DEFAULT_READ_FLUSH_MS } from "./read-outcome-batching.js";
import {
  type ClaimedRun,
  type Fence,
  type InvocationIntent,
  type InvocationState,
  type RunControlState,
  type RunHistory,
  type RunInputMessage,
  type RunStore,
  type Settlement,
  type StepCommit,
  type ToolOutcomeCommit,
} from "./run-store.js";

export interface RunnerDeps {
  readonly store: RunStore;
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly tools: ToolRegistry;
  readonly now: () => Date;
  readonly log: Logger;
  /** Consecutive turns the model may get wrong (bad tool, bad arguments, unmet contract) before the run fails. */
  readonly maxInvalidTurns: number;
  readonly compaction?: CompactionOptions;
  /**
   * How long a finished read's result may wait to be committed with the run's next commit
   * (read-outcome-batching.ts); 0 commits every result on its own. Default DEFAULT_READ_FLUSH_MS.
   */
  readonly readFlushMs?: number;
  /**
   * Calls `listener` with a run's id when its control state (cancellation, supersession, pause,
   * triggers) changed, or with "" when any run's may have (a policy change, a lost notification).
   * Without it, a held read's control state is read after every read.
   */
  readonly controlChanges?: (listener: (runId: string) => void) => () => void;
}

export interface StepContext {
  readonly workerId: string;
  readonly signal: AbortSignal;
}

/** Thrown inside the loop when the run has been settled or handed back; ends this claim quietly. */
class RunParked extends Error {}

/** Thrown when one call has been settled out of band (interrupted); the step's next call goes on. */
class StepContinues extends Error {}

/**
 * Drives one claimed run until it settles or parks, in the order the harness contract
 * gives: load the durable state; prepare the profile's turn and the policy-filtered
 * catalog; make and validate one model turn; commit the step with every call's intent;
 * then, per call, authorize again, dispatch and commit its result. Every write is
 * fenced by the lease epoch, so a worker that lost its lease changes nothing.
 */
export async function advanceRun(deps: RunnerDeps, claimed: ClaimedRun, context: StepContext): Promise<void> {
  const flushAfterMs = deps.readFlushMs ?? DEFAULT_READ_FLUSH_MS;
  const controlChanges = deps.controlChanges;
  const store =
    flushAfterMs <= 0
      ? undefined
      : batchReadOutcomes(deps.store, {
          flushAfterMs,
          ...(controlChanges === undefined
            ? {}
            : { watchControl: (changed: () => void) => controlChanges((runId) => (runId === "" || runId === claimed.runId) && changed()) }),
          onFlushError: (error) => deps.log.warn({ err: error, runId: claimed.runId }, "committing held read results failed; the next commit reports it"),
        });
  const driver = new RunDriver(store === undefined ? deps : { ...deps, store }, claimed, context);
  try {
    await driver.run();
  } catch (error) {
    if (error instanceof RunParked) return;
    throw error;
  } finally {
    store?.close();
  }
}

function initialControl(claimed: ClaimedRun): RunControlState {
  return {
    cancelRequestedByActorId: claimed.cancelRequestedByActorId,
    supersededByRunId: claimed.supersededByRunId,
    paused: false,
    policy: claimed.agent.policy,
    triggerCount: claimed.triggerCount,
  };
}

class RunDriver {
  private usage: RunUsage;
  private stepIndex: number;
  private invalidTurns = 0;
  /** The committed state, kept in step with every commit so an iteration needs no reads. */
  private history: RunHistory = { steps: [], artifacts: [], inherited: [] };
  private control: RunControlState;
  /** The run's input: its triggers, read again when a commit reports that an amendment arrived. */
  private messages: readonly RunInputMessage[];
  private triggerCount: number;
  private commitBoundary: CommitBoundary;
  private readonly fence: Fence;
  private readonly log: Logger;
  /** This worker's last model call on the run: the next one is stored as a delta on it. */
  private previousRequest: PreviousModelRequest | undefined;

  constructor(
    private readonly deps: RunnerDeps,
    private readonly claimed: ClaimedRun,
    private readonly context: StepContext,
  ) {
    this.usage = claimed.usage;
    this.stepIndex = claimed.stepCount;
    this.fence = { runId: claimed.runId, workerId: context.workerId, epoch: claimed.epoch };
    this.control = initialControl(claimed);
    this.messages = claimed.messages;
    this.triggerCount = claimed.triggerCount;
    this.commitBoundary = claimed.commitBoundary;
    this.log = deps.log.child({ runId: claimed.runId, workerId: context.workerId, epoch: claimed.epoch });
  }

  async run(): Promise<void> {
    // A fresh run with nothing to inherit has no history to read: its first model call waits on nothing.
    if (this.claimed.stepCount > 0 || this.claimed.inheritsFromRunId !== undefined) {
      this.history = await this.deps.store.loadHistory(this.claimed.runId);
      if (await this.recover(this.history)) this.history = await this.deps.store.loadHistory(this.claimed.runId);
    }
    for (;;) {
      await this.checkpoint();
      const check = budgetBeforeModelCall(this.claimed.agent.budget, this.usage, this.elapsed());
      if (check !== undefined) await this.exhaust(check);
      await this.iterate(this.history);
    }
  }

  /**
   * A resumed run may hold calls a dead worker never finished. A read is marked
   * interrupted (the model may ask again); a write's outcome is unknown and is never
   * replayed: the tool's own lookup may settle it, else the run waits for an operator.
   */
  private async recover(history: RunHistory): Promise<boolean> {
    const pending = history.steps.flatMap((step) => step.invocations).filter((i) => i.status === "pending");
    const unresolved = history.steps.flatMap((s) => s.invocations).filter((i) => i.status === "unknown_outcome" && i.resolvedOutcome === undefined);
    if (pending.length === 0 && unresolved.length === 0) return false;
    let waiting = unresolved.length > 0;
    for (const [i, invocation] of pending.entries()) {
      const tool = this.deps.tools.get(invocation.toolName);
      const last = i === pending.length - 1;
      if (tool?.definition.parksForInput === true) {
        await this.parkForInput(invocation);
      }
      if (await this.reattach(tool, invocation, afterRecovery(last, waiting), last && waiting)) continue;
      if (invocation.effect === "read") {
        await this.settleTool(invocation.id, invocation.effect, "interrupted", "", afterRecovery(last, waiting), {
          summary: `${invocation.toolName} interrupted by a worker restart`,
          ...(last && waiting ? { waitReason: "unknown_write_outcome" as const } : {}),
        });
        continue;
      }
      const looked = await this.lookup(tool, invocation);
      if (looked !== "unknown") {
        await this.settleTool(invocation.id, invocation.effect, "unknown_outcome", "", afterRecovery(last, waiting), {
          summary: `${invocation.toolName}: lookup found it ${looked}`,
          resolvedOutcome: looked,
          ...(last && waiting ? { waitReason: "unknown_write_outcome" as const } : {}),
        });
        continue;
      }
      waiting = true;
      await this.settleTool(invocation.id, invocation.effect, "unknown_outcome", "", last ? "waiting" : "awaiting_tool", {
        summary: `${invocation.toolName}: outcome unknown after a worker stopped; waiting for an operator`,
        ...(last ? { waitReason: "unknown_write_outcome" as const } : {}),
      });
    }
    if (waiting) {
      if (pending.length === 0) {
        await this.deps.store.commitStep({
          ...this.fence,
          step: undefined,
          status: "waiting",
          waitReason: "unknown_write_outcome",
          usage: this.usage,
          emissions: [],
          summary: "an unknown write outcome is still unresolved",
        });
      }
      throw new RunParked();
    }
    return true;
  }

  /** Commits the real outcome of a call whose execution outlived its worker, if the tool can still see it. */
  private async reattach(tool: RegisteredTool | undefined, invocation: InvocationState, status: RunStatus, waitingAfter: boolean): Promise<boolean> {
    if (tool?.definition.reattach === undefined) return false;
    let seq = 1_000_000; // after anything the first worker observed
    let result;
    try {
      result = await tool.definition.reattach(JSON.parse(invocation.argumentsJson) as Record<string, unknown>, {
        runId: this.claimed.runId,
        invocationId: invocation.id,
        signal: this.context.signal,
        grant: this.deps.tools.grantFor(this.claimed.agent, invocation.toolName),
        agent: this.claimed.agent,
        observe: (stream, text) => this.deps.store.appendObservation(this.claimed.runId, invocation.id, ++seq, stream, text),
      });
    } catch (error) {
      if (this.context.signal.aborted) throw error;
      this.log.warn({ err: error, tool: invocation.toolName }, "re-attaching to a call failed; recovering it as if its worker died");
      return false;
    }
    if (result === undefined) return false;
    await this.commitToolOutcome({
      ...this.fence,
      invocationId: invocation.id,
      effect: invocation.effect,
      outcome: result.ok ? "succeeded" : "failed",
      resultText: result.text,
      artifacts: (result.artifacts ?? []).map((artifact) => ({ ...artifact, id: randomUUID() })),
      ...(result.exitCode === undefined ? {} : { exitCode: result.exitCode }),
      ...(result.truncated === undefined ? {} : { truncated: result.truncated }),
      ...(waitingAfter ? { waitReason: "unknown_write_outcome" as const } : {}),
      status,
      usage: this.usage,
      emissions: [],
      summary: `${invocation.toolName} re-attached after a restart: ${result.ok ? "succeeded" : "failed"}`,
    });
    return true;
  }

  private async lookup(tool: RegisteredTool | undefined, invocation: InvocationState): Promise<"applied" | "not_applied" | "unknown"> {
    if (tool?.definition.lookup === undefined) return "unknown";
    try {
      return await tool.definition.lookup(JSON.parse(invocation.argumentsJson) as Record<string, unknown>, {
        runId: this.claimed.runId,
        invocationId: invocation.id,
        signal: this.context.signal,
        grant: this.deps.tools.grantFor(this.claimed.agent, invocation.toolName),
        agent: this.claimed.agent,
      });
    } catch (error) {
      this.log.warn({ err: error, tool: invocation.toolName }, "outcome lookup failed; leaving it to an operator");
      return "unknown";
    }
  }

  /** Safe point: stop for shutdown, cancellation or pause before doing anything new. */
  private async checkpoint(): Promise<void> {
    if (this.context.signal.aborted) {
      await this.deps.store.release(this.fence, "worker shutting down; handed back").catch(() => {});
      throw new RunParked();
    }
    const control = this.control;
    if (control.supersededByRunId !== undefined) await this.endSuperseded(control.supersededByRunId);
    if (control.cancelRequestedByActorId !== undefined) await this.stopCancelled(control.cancelRequestedByActorId);
    if (control.paused) {
      await this.deps.store.release(this.fence, "paused by an operator");
      throw new RunParked();
    }
    // An amendment arrived since the run last read its input: the next model call sees it.
    if (control.triggerCount !== this.triggerCount) {
      const input = await this.deps.store.loadTriggers(this.claimed.runId);
      this.messages = input.messages;
      this.triggerCount = input.triggerCount;
    }
  }

  /** Superseded: stop without a reply or an ack; the successor answers the same request and settles its ack. */
  private async endSuperseded(successorId: string): Promise<never> {
    this.usage = { ...this.usage, wallClockMs: this.elapsed() };
    await this.deps.store.commitStep({ ...this.fence, step: undefined, status: "cancelled", usage: this.usage, emissions: [], summary: `superseded by run ${successorId}` });
    throw new RunParked();
  }

  /** Past the commit boundary a stop must say what was already done; before it, the failed ack says enough. */
  private async stopCancelled(actorId: string): Promise<never> {
    const reply = cancellationReply(this.commitBoundary, actorId, () => ({
      stepsDone: this.history.steps.length,
      effects: this.history.steps.flatMap((s) => s.invocations).filter((i) => i.effect === "write" && (i.status === "succeeded" || i.resolvedOutcome === "applied")).map((i) => i.toolName),
    }));
    if (reply === undefined) return this.settle("cancelled", { summary: `cancelled by ${actorId}` });
    return this.settle("cancelled", { summary: `cancelled by ${actorId} past the commit boundary; partial result sent`, replyText: reply, finalReply: reply });
  }

  private async iterate(history: RunHistory): Promise<void> {
    const agent = this.claimed.agent;
    const profile = profileFor(agent.profile.name, agent.profile.version);
    const catalog = this.deps.tools.catalogFor(agent, this.claimed.connector);
    const systemPrompt = [agent.systemPrompt, profile?.instructions() ?? ""].filter((s) => s.trim() !== "").join("\n\n");
    const transcript = buildTranscript({
      systemPrompt,
      requests: this.messages.filter((m) => !m.inherited),
      steps: history.steps,
      inherited: { requests: this.messages.filter((m) => m.inherited), steps: history.inherited },
    });
    const refs = Object.fromEntries(
      [...history.inherited, ...history.steps].flatMap((s) => s.invocations).map((i) => [i.providerCallId, i.id] as const),
    );
    const messages = compactToolResults(transcript, refs, this.deps.compaction ?? DEFAULT_COMPACTION);
    const tools = catalog.map((t) => t.spec);

    const spec = agent.models.primary;
    const startedAt = this.deps.now();
    const turn = await this.callModel(spec, messages, tools);
    const latencyMs = this.deps.now().getTime() - startedAt.getTime();
    const cost = costMicroUsd(turn.usage, spec.prices);
    this.usage = {
      ...this.usage,
      iterations: this.usage.iterations + 1,
      modelCalls: this.usage.modelCalls + 1,
      inputTokens: this.usage.inputTokens + turn.usage.inputTokens,
      outputTokens: this.usage.outputTokens + turn.usage.outputTokens,
      outputBytes: this.usage.outputBytes + byteLength(turn.text),
      costMicroUsd: this.usage.costMicroUsd + cost,
      wallClockMs: this.elapsed(),
    };
    const callId = randomUUID();
    const previousRequest = this.previousRequest;
    const request = requestForStorage(callId, { messages, tools }, previousRequest);
    this.previousRequest = request.remembered;
    const step = {
      id: randomUUID(),
      index: this.stepIndex,
      actorId: this.actorOfStep(history),
      startedAt,
      modelCall: {
        id: callId,
        role: "primary" as const,
        provider: spec.provider,
        model: spec.model === "" ? spec.provider : spec.model,
        request: request.stored,
        responseText: turn.text,
        toolCalls: turn.toolCalls,
        inputTokens: turn.usage.inputTokens,
        outputTokens: turn.usage.outputTokens,
        latencyMs,
        finishReason: turn.finishReason,
        costMicroUsd: cost,
      },
    };
    this.stepIndex += 1;

    if (turn.toolCalls.length === 0) {
      const overrun = budgetOverrun(agent.budget, this.usage, this.elapsed());
      const output = profile?.interpretOutput(turn.text) ?? { finalText: turn.text, proposed: undefined };
      const evaluator = profile === undefined ? undefined : evaluatorFor(profile.evaluator.name, profile.evaluator.version);
      const completion = evaluator?.evaluate({
        finalText: output.finalText,
        artifacts: [
          ...history.artifacts,
          ...(output.proposed === undefined
            ? []
            : [{ id: "proposed", type: output.proposed.type, provenance: "model" as const, subjectArtifactId: undefined, conclusion: undefined }]),
        ],
      }) ?? { complete: true as const };
      if (completion.complete || overrun !== undefined) {
        const reply: StepCommit = {
          ...this.fence,
          step: { ...step, replayability: "replayable", invocations: [] },
          ...this.settlement("succeeded", { summary: "replied", replyText: output.finalText, finalReply: output.finalText }),
          // Over budget, the reply stands even if more input came: there is no budget left to answer it.
          unlessChangedSince: { triggerCount: overrun === undefined ? this.triggerCount : undefined },
        };
        const control = await this.deps.store.commitStep(reply);
        if (!refusedReply(reply.unlessChangedSince, control)) throw new RunParked();
        // Stopped, or given more input, while the model wrote this reply: nothing was committed.
        // The checkpoint handles it as if it had come a moment sooner (a stop ends the run; new
        // input goes to the model). The call still counts against the budget.
        this.control = control;
        this.stepIndex = step.index;
        this.previousRequest = previousRequest;
        return;
      }
      const feedback = `Your reply does not complete the task yet (${profile?.evaluator.name} v${profile?.evaluator.version}): ${completion.missing}`;
      await this.commitInvalid(step, [], feedback);
      return;
    }

    const intents = turn.toolCalls.map((call, ordinal) => this.validate(call, ordinal, catalog));
    const overrun = budgetOverrun(agent.budget, this.usage, this.elapsed());
    if (overrun !== undefined) {
      const refused = intents.map((intent) => ({ ...intent, status: "refused" as const, refusalReason: `not run: ${exhaustionNote(overrun)}` }));
      await this.deps.store.commitStep({
        ...this.fence,
        step: { ...step, replayability: "replayable", invocations: refused },
        ...this.exhaustionSettlement(overrun, history),
      });
      throw new RunParked();
    }
    const pending = intents.filter((intent) => intent.status === "pending");
    if (pending.length === 0) {
      await this.commitInvalid(step, intents, "None of your tool calls could run; see each call's result for why.");
      return;
    }
    this.invalidTurns = 0;
    const effectful = pending.some((intent) => intent.effect === "write");
    await this.commitStep({
      ...this.fence,
      step: { ...step, replayability: effectful ? "not_replayable" : "replayable", invocations: intents },
      crossesCommitBoundary: effectful,
      status: "awaiting_tool",
      usage: this.usage,
      emissions: [],
      summary: `${pending.length} tool call(s) to dispatch`,
    });
    for (const [i, intent] of pending.entries()) {
      try {
        await this.dispatch(intent, i === pending.length - 1, pending.slice(i + 1));
      } catch (error) {
        if (!(error instanceof StepContinues)) throw error;
      }
    }
  }

  /** Records a turn the model got wrong and tells it why; too many in a row fail the run. */
  private async commitInvalid(
    step: Omit<NonNullable<Parameters<RunStore["commitStep"]>[0]["step"]>, "replayability" | "invocations">,
    intents: readonly InvocationIntent[],
    feedback: string,
  ): Promise<void> {
    this.invalidTurns += 1;
    const giveUp = this.invalidTurns >= this.deps.maxInvalidTurns;
    await this.commitStep({
      ...this.fence,
      step: { ...step, replayability: "replayable", invocations: intents, feedback },
      ...(giveUp
        ? this.settlement("failed", {
            summary: `${this.invalidTurns} invalid model turns in a row`,
            error: `the model made ${this.invalidTurns} invalid turns in a row; last problem: ${feedback}`,
            replyText: `Sorry, I could not finish this: the model kept producing turns that could not be used (${feedback}).`,
          })
        : { status: "running" as const, usage: this.usage, emissions: [], summary: `invalid turn: ${feedback}` }),
    });
    if (giveUp) throw new RunParked();
  }

  /** The tool exists in this run's catalog and its arguments parse against its schema. */
  private validate(call: ToolCallRequest, ordinal: number, catalog: readonly RegisteredTool[]): InvocationIntent {
    const [name, version] = splitName(call.name);
    const base = { id: randomUUID(), providerCallId: call.id, ordinal, toolName: call.name, toolVersion: version, argumentsJson: call.argumentsJson };
    const refuse = (reason: string, effect: "read" | "write" = "read"): InvocationIntent => ({ ...base, effect, status: "refused", refusalReason: reason });
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
    const args = checked.data as Record<string, unknown>;
    void name;
    return {
      ...base,
      argumentsJson: JSON.stringify(args),
      effect: this.deps.tools.effectOf(tool, args, this.deps.tools.grantFor(this.claimed.agent, tool.fullName)),
      status: "pending",
    };
  }

  /** Authorize again with the policy as it is now, then run the call and commit its result. */
  private async dispatch(intent: InvocationIntent, last: boolean, rest: readonly InvocationIntent[]): Promise<void> {
    const after: RunStatus = last ? "running" : "awaiting_tool";
    const control = this.control;
    if (control.cancelRequestedByActorId !== undefined) {
      const why = control.supersededByRunId === undefined ? `cancelled by ${control.cancelRequestedByActorId}` : `superseded by run ${control.supersededByRunId}`;
      for (const remaining of [intent, ...rest]) {
        await this.settleTool(remaining.id, remaining.effect, "refused", "", "awaiting_tool", { summary: "not run: cancelled", refusalReason: `not run: the run was ${why}` });
      }
      if (control.supersededByRunId !== undefined) await this.endSuperseded(control.supersededByRunId);
      await this.stopCancelled(control.cancelRequestedByActorId);
    }
    const check = budgetBeforeToolCall(this.claimed.agent.budget, this.usage, this.elapsed());
    if (check !== undefined) {
      for (const remaining of [intent, ...rest]) {
        await this.settleTool(remaining.id, remaining.effect, "refused", "", "awaiting_tool", { summary: "not run: budget", refusalReason: `not run: ${exhaustionNote(check)}` });
      }
      await this.exhaust(check);
    }
    const tool = this.deps.tools.get(intent.toolName);
    const args = JSON.parse(intent.argumentsJson) as Record<string, unknown>;
    const decision =
      tool === undefined
        ? { allowed: false as const, reason: `tool ${intent.toolName} is no longer registered` }
        : mayDispatch(control.policy, { fullName: intent.toolName, effect: intent.effect }, args);
    if (!decision.allowed) {
      await this.settleTool(intent.id, intent.effect, "refused", "", after, { summary: `refused at dispatch: ${decision.reason}`, refusalReason: decision.reason });
      return;
    }
    if (tool!.definition.parksForInput === true) {
      for (const remaining of rest) {
        await this.settleTool(remaining.id, remaining.effect, "refused", "", "awaiting_tool", {
          summary: "not run: waiting for an answer",
          refusalReason: "not run: the run stopped to wait for an answer to keel.ask_user; call it again afterwards if still needed",
        });
      }
      await this.parkForInput({ id: intent.id, argumentsJson: intent.argumentsJson });
    }

    const started = this.deps.now().getTime();
    let seq = 0;
    let outcome: "succeeded" | "failed";
    let result;
    try {
      result = await tool!.definition.execute(args, {
        runId: this.claimed.runId,
        invocationId: intent.id,
        signal: this.context.signal,
        grant: this.deps.tools.grantFor(this.claimed.agent, intent.toolName),
        agent: this.claimed.agent,
        observe: (stream, text) => this.deps.store.appendObservation(this.claimed.runId, intent.id, ++seq, stream, text),
      });
      outcome = result.ok ? "succeeded" : "failed";
    } catch (error) {
      if (this.context.signal.aborted) throw error; // shutting down mid-call: recovery decides on resume
      if (error instanceof ToolOutcomeUnknownError) await this.outcomeLost(intent, rest, error.message);
      result = { ok: false, text: `The tool failed: ${error instanceof Error ? error.message : String(error)}` };
      outcome = "failed";
    }
    this.usage = {
      ...this.usage,
      toolCalls: this.usage.toolCalls + 1,
      outputBytes: this.usage.outputBytes + byteLength(result.text),
      wallClockMs: this.elapsed(),
    };
    await this.commitToolOutcome({
      ...this.fence,
      invocationId: intent.id,
      effect: intent.effect,
      outcome,
      resultText: result.text,
      durationMs: this.deps.now().getTime() - started,
      artifacts: (result.artifacts ?? []).map((artifact) => ({ ...artifact, id: randomUUID() })),
      ...(result.exitCode === undefined ? {} : { exitCode: result.exitCode }),
      ...(result.truncated === undefined ? {} : { truncated: result.truncated }),
      status: after,
      usage: this.usage,
      emissions: [],
      summary: `${intent.toolName} ${outcome}`,
    });
  }

  /** Commits a step and keeps the in-memory history and control state in step with the ledger. */
  private async commitStep(commit: StepCommit): Promise<void> {
    this.control = await this.deps.store.commitStep(commit);
    if (commit.crossesCommitBoundary === true) this.commitBoundary = "committed";
    const step = commit.step;
    if (step === undefined) return;
    this.history = {
      ...this.history,
      steps: [
        ...this.history.steps,
        {
          index: step.index,
          replayability: step.replayability,
          responseText: step.modelCall?.responseText ?? "",
          toolCalls: step.modelCall?.toolCalls ?? [],
          feedback: step.feedback,
          invocations: step.invocations.map((intent) => ({
            id: intent.id,
            providerCallId: intent.providerCallId,
            toolName: intent.toolName,
            effect: intent.effect,
            argumentsJson: intent.argumentsJson,
            status: intent.status,
            resultText: undefined,
            refusalReason: intent.refusalReason,
            resolvedOutcome: undefined,
            resolvedByActorId: undefined,
            resolutionReason: undefined,
          })),
        },
      ],
    };
  }

  private async commitToolOutcome(commit: ToolOutcomeCommit): Promise<void> {
    this.control = await this.deps.store.commitToolOutcome(commit);
    const settle = (invocation: InvocationState): InvocationState =>
      invocation.id !== commit.invocationId
        ? invocation
        : {
            ...invocation,
            status: commit.outcome,
            resultText: commit.resultText,
            refusalReason: commit.refusalReason ?? invocation.refusalReason,
            resolvedOutcome: commit.resolvedOutcome ?? invocation.resolvedOutcome,
            resolvedByActorId: commit.answeredByActorId ?? invocation.resolvedByActorId,
          };
    const now = this.deps.now();
    this.history = {
      inherited: this.history.inherited,
      steps: this.history.steps.map((step) => ({ ...step, invocations: step.invocations.map(settle) })),
      artifacts: [
        ...this.history.artifacts,
        ...commit.artifacts.map((artifact) => ({
          id: artifact.id,
          runId: this.claimed.runId,
          toolInvocationId: commit.invocationId,
          type: artifact.type,
          schemaVersion: artifact.schemaVersion,
          provenance: artifact.provenance,
          inlineData: artifact.inlineData,
          reference: artifact.reference,
          subjectArtifactId: artifact.subjectArtifactId,
          conclusion: artifact.conclusion,
          createdAt: now,
        })),
      ],
    };
  }

  /**
   * The call's executor lost track of it (its host vanished): a read is interrupted and the
   * loop goes on; a write's outcome is unknown, the calls after it are not run, and the run
   * waits for a lookup or an operator.
   */
  private async outcomeLost(intent: InvocationIntent, rest: readonly InvocationIntent[], why: string): Promise<never | void> {
    if (intent.effect === "read") {
      await this.settleTool(intent.id, "read", "interrupted", "", rest.length === 0 ? "running" : "awaiting_tool", {
        summary: `${intent.toolName} interrupted: ${why}`,
      });
      throw new StepContinues();
    }
    for (const remaining of rest) {
      await this.settleTool(remaining.id, remaining.effect, "refused", "", "awaiting_tool", {
        summary: "not run: an earlier call's outcome is unknown",
        refusalReason: "not run: an earlier call in this turn has an unknown outcome",
      });
    }
    await this.settleTool(intent.id, "write", "unknown_outcome", "", "waiting", {
      summary: `${intent.toolName}: outcome unknown (${why}); waiting for an operator`,
      waitReason: "unknown_write_outcome",
    });
    throw new RunParked();
  }

  private async parkForInput(invocation: Pick<InvocationState, "id" | "argumentsJson">): Promise<never> {
    const question = String((JSON.parse(invocation.argumentsJson) as { question?: unknown }).question ?? "");
    await this.deps.store.commitStep({
      ...this.fence,
      step: undefined,
      status: "awaiting_input",
      usage: this.usage,
      emissions: [questionDraft({ replyToMessageId: this.claimed.replyToMessageId, addressedActorIds: this.addressed() }, invocation.id, question)],
      summary: "asked the conversation a question",
    });
    throw new RunParked();
  }

  private async settleTool(
    invocationId: string,
    effect: "read" | "write",
    outcome: "interrupted" | "unknown_outcome" | "refused",
    resultText: string,
    status: RunStatus,
    extra: { summary: string; refusalReason?: string; resolvedOutcome?: "applied" | "not_applied"; waitReason?: "unknown_write_outcome" },
  ): Promise<void> {
    await this.commitToolOutcome({
      ...this.fence,
      invocationId,
      effect,
      outcome,
      resultText,
      artifacts: [],
      ...(extra.refusalReason === undefined ? {} : { refusalReason: extra.refusalReason }),
      ...(extra.resolvedOutcome === undefined ? {} : { resolvedOutcome: extra.resolvedOutcome, answeredByActorId: "lookup" }),
      ...(extra.waitReason === undefined ? {} : { waitReason: extra.waitReason }),
      status,
      usage: this.usage,
      emissions: [],
      summary: extra.summary,
    });
  }

  private async callModel(spec: ModelSpec, messages: Parameters<ModelProvider["complete"]>[0]["messages"], tools: Parameters<ModelProvider["complete"]>[0]["tools"]): Promise<ModelTurn> {
    const provider = this.deps.providers[spec.provider];
    const remaining = Math.max(1, this.claimed.agent.budget.maxWallClockMs - this.elapsed());
    const modelTimeoutMs = spec.timeoutMs > 0 ? spec.timeoutMs : DEFAULT_MODEL_TIMEOUT_MS;
    // One controller per call, aborted by the worker's shutdown or the call's timeout (cheaper
    // than AbortSignal.any and AbortSignal.timeout, which every iteration would pay for).
    const call = new AbortController();
    let timedOut = false;
    const stop = () => call.abort(this.context.signal.reason);
    this.context.signal.addEventListener("abort", stop, { once: true });
    const timer = setTimeout(() => {
      timedOut = true;
      call.abort(new DOMException("the model call timed out", "TimeoutError"));
    }, Math.min(modelTimeoutMs, remaining));
    try {
      if (this.context.signal.aborted) stop();
      return await provider.complete({ spec, messages, tools, callIndex: this.usage.modelCalls, signal: call.signal });
    } catch (error) {
      if (this.context.signal.aborted || !(error instanceof DomainError)) throw error;
      this.usage = { ...this.usage, modelCalls: this.usage.modelCalls + 1, wallClockMs: this.elapsed() };
      if (timedOut && remaining < modelTimeoutMs) {
        // The run's wall clock, not the model's own timeout, cut the call short: the budget ran out.
        const limit = this.claimed.agent.budget.maxWallClockMs;
        await this.exhaust({ exhausted: "wall_clock", limit, used: Math.max(limit, this.elapsed()) });
      }
      return this.settle("failed", {
        summary: `model call failed: ${error.message}`,
        error: error.message,
        replyText: `Sorry, I could not finish this: the model call failed (${error.message}).`,
      });
    } finally {
      clearTimeout(timer);
      this.context.signal.removeEventListener("abort", stop);
    }
  }

  private async exhaust(check: BudgetCheck): Promise<never> {
    await this.deps.store.commitStep({ ...this.fence, step: undefined, ...this.exhaustionSettlement(check, this.history) });
    throw new RunParked();
  }

  private exhaustionSettlement(check: BudgetCheck, history: RunHistory): Settlement {
    const reply = exhaustionReply({
      check,
      request: this.messages.map((m) => m.text).join("\n"),
      stepsDone: history.steps.length,
      toolCallsDone: history.steps.flatMap((s) => s.invocations).filter((i) => i.status === "succeeded").map((i) => i.toolName),
    });
    return { ...this.settlement("budget_exhausted", { summary: `budget exhausted: ${check.exhausted}`, replyText: reply, finalReply: reply }), exhaustedDimension: check.exhausted };
  }

  private async settle(status: RunStatus, outcome: { summary: string; replyText?: string; finalReply?: string; error?: string }): Promise<never> {
    await this.deps.store.commitStep({ ...this.fence, step: undefined, ...this.settlement(status, outcome) });
    throw new RunParked();
  }

  /** The run's terminal status with its reply and the ack that replaces the hourglass. */
  private settlement(status: RunStatus, outcome: { summary: string; replyText?: string; finalReply?: string; error?: string }): Settlement {
    const emissions = settlementDrafts(
      { runId: this.claimed.runId, logicalRequestId: this.claimed.logicalRequestId, replyToMessageId: this.claimed.replyToMessageId, addressedActorIds: this.addressed() },
      status,
      outcome.replyText,
    );
    this.usage = { ...this.usage, wallClockMs: this.elapsed() };
    return {
      status,
      usage: this.usage,
      emissions,
      summary: outcome.summary,
      ...(outcome.finalReply === undefined ? {} : { finalReply: outcome.finalReply }),
      ...(outcome.error === undefined ? {} : { error: outcome.error }),
    };
  }

  private addressed(): string[] {
    return [...new Set(this.messages.map((m) => m.actorId))];
  }

  /** Whose input this step acts on: the last answer to keel.ask_user, else the requester. */
  /** Who the step acts for: the last actor who answered a question in this run, else the requester. */
  private actorOfStep(history: RunHistory): string {
    for (let s = history.steps.length - 1; s >= 0; s--) {
      const invocations = history.steps[s]!.invocations;
      for (let i = invocations.length - 1; i >= 0; i--) {
        const invocation = invocations[i]!;
        if (invocation.resolvedByActorId !== undefined && invocation.status === "succeeded") return invocation.resolvedByActorId;
      }
    }
    return this.claimed.requestedByActorId;
  }

  private elapsed(): number {
    return Math.max(0, this.deps.now().getTime() - this.claimed.startedAt.getTime());
  }
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

function splitName(fullName: string): [string, string] {
  const at = fullName.lastIndexOf(".");
  return at < 0 ? [fullName, ""] : [fullName.slice(0, at), fullName.slice(at + 1)];
}

function exhaustionNote(check: BudgetCheck): string {
  return `the run's ${check.exhausted.replace("_", " ")} budget is used up`;
}
