// Where a replay parted from its recording, step by step: a different tool call or arguments, a
// call the policy now refuses or now allows, another ending (a budget ran out, or did not).
import type { BudgetDimension, RunStatus } from "../domain/run.js";
import type { RecordedInvocation, RecordedRun } from "../ledger/replay-source.repository.js";
import type { InvocationState, StepState } from "../runner/run-store.js";

export interface Divergence {
  readonly kind: "model_call" | "steps" | "tool_call" | "arguments" | "policy" | "budget" | "outcome";
  /** The step (RunStep.index) where it shows; -1 for the run's ending. */
  readonly stepIndex: number;
  readonly detail: string;
}

export interface ReplayedRun {
  readonly status: RunStatus;
  readonly exhaustedDimension: BudgetDimension | undefined;
  readonly finalReply: string | undefined;
  readonly steps: readonly StepState[];
}

/** JSON with object keys sorted, so the ledger's jsonb key order never reads as a change. */
function canonical(json: string): string {
  const sort = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(sort);
    if (value !== null && typeof value === "object") {
      return Object.fromEntries(Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, v]) => [k, sort(v)]));
    }
    return value;
  };
  try {
    return JSON.stringify(sort(JSON.parse(json)));
  } catch {
    return json;
  }
}

const refused = (status: string) => status === "refused";
const why = (reason: string | undefined) => (reason === undefined || reason === "" ? "" : `: ${reason}`);

function compareCall(stepIndex: number, recorded: RecordedInvocation | undefined, replayed: InvocationState | undefined): Divergence | undefined {
  if (recorded === undefined && replayed === undefined) return undefined;
  if (recorded === undefined) return { kind: "tool_call", stepIndex, detail: `the replay calls ${replayed!.toolName}; the recording has no such call` };
  if (replayed === undefined) return { kind: "tool_call", stepIndex, detail: `the recording calls ${recorded.toolName}; the replay does not` };
  if (recorded.toolName !== replayed.toolName) {
    return { kind: "tool_call", stepIndex, detail: `the replay calls ${replayed.toolName} where the recording called ${recorded.toolName}` };
  }
  const [was, now] = [canonical(recorded.argumentsJson), canonical(replayed.argumentsJson)];
  if (was !== now) return { kind: "arguments", stepIndex, detail: `${replayed.toolName} with ${now}; the recording had ${was}` };
  if (refused(recorded.status) !== refused(replayed.status)) {
    return refused(replayed.status)
      ? { kind: "policy", stepIndex, detail: `${replayed.toolName} ${now} is now refused${why(replayed.refusalReason)}; the recording has it ${recorded.status}` }
      : { kind: "policy", stepIndex, detail: `${replayed.toolName} ${now} is now allowed; the recording has it refused${why(recorded.refusalReason)}` };
  }
  return undefined;
}

/** Every divergence of `replayed` from `recorded`, in step order, the ending last. */
export function compareWithRecording(recorded: RecordedRun, replayed: ReplayedRun): Divergence[] {
  const found: Divergence[] = [];
  const steps = Math.max(recorded.stepCount, replayed.steps.length);
  for (let index = 0; index < steps; index++) {
    const step = replayed.steps.find((s) => s.index === index);
    const calls = recorded.invocations.filter((i) => i.stepIndex === index);
    if (step === undefined && index >= replayed.steps.length) {
      found.push({ kind: "steps", stepIndex: index, detail: `the replay stopped after ${replayed.steps.length} steps; the recording has ${recorded.stepCount}` });
      break;
    }
    const ordinals = Math.max(calls.length, step?.invocations.length ?? 0);
    for (let ordinal = 0; ordinal < ordinals; ordinal++) {
      const divergence = compareCall(index, calls[ordinal], step?.invocations[ordinal]);
      if (divergence !== undefined) found.push(divergence);
    }
  }
  if (recorded.status !== replayed.status || recorded.exhaustedDimension !== replayed.exhaustedDimension) {
    const ending = (status: string, dimension: string | undefined) => (dimension === undefined ? status : `${status} (${dimension})`);
    const budget = recorded.exhaustedDimension !== undefined || replayed.exhaustedDimension !== undefined;
    found.push({
      kind: budget ? "budget" : "outcome",
      stepIndex: -1,
      detail: `the replay ends ${ending(replayed.status, replayed.exhaustedDimension)}; the recording ended ${ending(recorded.status, recorded.exhaustedDimension)}`,
    });
  }
  return found;
}

/** One line per divergence, as `keel replay` prints them. */
export function describeDivergence(divergence: Divergence): string {
  const where = divergence.stepIndex < 0 ? "end" : `step ${divergence.stepIndex}`;
  return `${where}: ${divergence.kind}: ${divergence.detail}`;
}
