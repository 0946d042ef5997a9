// Re-runs a recorded run through the real runner against an in-memory RunStore, so nothing is
// written to the live ledger: the model answers with the recorded turns in order and every tool
// call is answered from its recorded outcome, never executed. What the current code does
// differently (a call now refused or allowed, other arguments, another ending) is a divergence.
import { pino } from "pino";
import type { AgentSpec } from "../domain/agent.js";
import type { ModelTurn } from "../domain/transcript.js";
import type { RecordedInvocation, RecordedRun } from "../ledger/replay-source.repository.js";
import type { ModelProvider } from "../models/model-provider.js";
import { InMemoryRunStore } from "../runner/in-memory-run-store.js";
import { settledInvocation, type InvocationState } from "../runner/run-store.js";
import { advanceRun } from "../runner/runner.js";
import { createToolRegistry, type ToolDefinition, type ToolRegistry } from "../tools/tool-registry.js";
import { compareWithRecording, type Divergence, type ReplayedRun } from "./divergence.js";

export interface ReplayReport {
  readonly runId: string;
  readonly divergences: readonly Divergence[];
  readonly replayed: ReplayedRun;
}

/** How often a parked replay (an answered keel.ask_user) is claimed again before giving up. */
const MAX_RESUMES = 32;

/** The recorded model turns in order; a call past the recording is itself a divergence. */
function replayModel(recorded: RecordedRun, divergences: Divergence[]): ModelProvider {
  return {
    complete(request) {
      const turn = recorded.turns[request.callIndex];
      if (turn === undefined) {
        divergences.push({ kind: "model_call", stepIndex: request.callIndex, detail: `model call #${request.callIndex + 1} was not in the recording (it made ${recorded.turns.length})` });
        return Promise.reject(new Error("replay: the recording has no more model turns"));
      }
      const answer: ModelTurn = {
        text: turn.text,
        toolCalls: turn.toolCalls,
        usage: { inputTokens: turn.inputTokens, outputTokens: turn.outputTokens },
        finishReason: turn.finishReason,
      };
      return Promise.resolve(answer);
    },
    decide: () => Promise.reject(new Error("replay: side decisions are not replayed")),
  };
}

/** The current tools with their schemas, effects and policy checks, each answering from the recording. */
function recordedTools(current: ToolRegistry, recorded: RecordedRun, store: InMemoryRunStore): ToolRegistry {
  const find = (invocationId: string): { state: InvocationState; stepIndex: number } | undefined => {
    for (const step of store.steps) {
      const state = step.invocations.find((i) => i.id === invocationId);
      if (state !== undefined) return { state, stepIndex: step.index };
    }
    return undefined;
  };
  const answering = (definition: ToolDefinition): ToolDefinition => ({
    name: definition.name,
    version: definition.version,
    description: definition.description,
    parameters: definition.parameters,
    effect: definition.effect,
    ...(definition.parksForInput === undefined ? {} : { parksForInput: definition.parksForInput }),
    // A call the recording does not hold as run gets no result here; the comparison names it.
    execute(_args, context) {
      const call = find(context.invocationId);
      const original = call === undefined ? undefined : recordedCall(recorded, call.stepIndex, call.state.providerCallId);
      if (original === undefined || (original.status !== "succeeded" && original.status !== "failed")) {
        return Promise.resolve({ ok: false, text: "replay: no recorded result for this call" });
      }
      return Promise.resolve({ ok: original.status === "succeeded", text: original.resultText ?? "", ...(original.exitCode === undefined ? {} : { exitCode: original.exitCode }) });
    },
  });
  return createToolRegistry(current.all().map((tool) => answering(tool.definition)));
}

function recordedCall(recorded: RecordedRun, stepIndex: number, providerCallId: string): RecordedInvocation | undefined {
  return recorded.invocations.find((i) => i.stepIndex === stepIndex && i.providerCallId === providerCallId);
}

/** Re-runs `recorded` against `agent` (by default its agent as defined now) and the current tools. */
export async function replayRun(recorded: RecordedRun, tools: ToolRegistry, agent: AgentSpec): Promise<ReplayReport> {
  const divergences: Divergence[] = [];
  const store = new InMemoryRunStore(agent);
  store.messages = [...recorded.messages];
  const model = replayModel(recorded, divergences);
  const deps = {
    store,
    providers: { scripted: model, openai: model },
    tools: recordedTools(tools, recorded, store),
    // Wall clock is not replayed: the recorded run's timing is not this process's.
    now: () => new Date(0),
    log: pino({ level: "silent" }),
    maxInvalidTurns: 3,
    readFlushMs: 0,
  };
  for (let claims = 0; claims < MAX_RESUMES; claims++) {
    await advanceRun(deps, { ...store.claim("replay"), connector: recorded.connector }, { workerId: "replay", signal: new AbortController().signal });
    if (store.status !== "awaiting_input" || !answerFromRecording(store, recorded)) break;
    store.status = "queued";
  }
  const replayed: ReplayedRun = {
    status: store.status,
    exhaustedDimension: store.exhaustedDimension,
    finalReply: store.finalReply,
    steps: store.steps,
  };
  return { runId: recorded.runId, divergences: [...divergences, ...compareWithRecording(recorded, replayed)], replayed };
}

/** Settles an open keel.ask_user with the answer the recording holds; false when it holds none. */
function answerFromRecording(store: InMemoryRunStore, recorded: RecordedRun): boolean {
  let answered = false;
  store.steps = store.steps.map((step) => ({
    ...step,
    invocations: step.invocations.map((invocation) => {
      if (invocation.status !== "pending" || !invocation.toolName.startsWith("keel.ask_user")) return invocation;
      const original = recordedCall(recorded, step.index, invocation.providerCallId);
      if (original?.status !== "succeeded") return invocation;
      answered = true;
      return settledInvocation(invocation, { invocationId: invocation.id, effect: "read", outcome: "succeeded", resultText: original.resultText ?? "", artifacts: [] });
    }),
  }));
  return answered;
}
