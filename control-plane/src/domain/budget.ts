// Run budgets. Every dimension is enforced on its own; none substitutes for another.
//
// Checks always report the FIRST exhausted dimension in this fixed order (the order of
// BudgetDimension): wall_clock, iterations, model_calls, tool_calls, input_tokens, output_tokens,
// output_bytes, cost. Which dimensions each check looks at, and how:
//
//   dimension      before model call   before tool call   overrun (after usage grew)
//   wall_clock     elapsed >= limit    elapsed >= limit   elapsed >= limit
//   iterations     used >= limit       -                  used > limit
//   model_calls    used >= limit       -                  used > limit
//   tool_calls     -                   used >= limit      used > limit
//   input_tokens   used >= limit       used > limit       used > limit
//   output_tokens  used >= limit       used > limit       used > limit
//   output_bytes   used >= limit       used >= limit      used > limit
//   cost           used >= limit       used > limit       used > limit
//
// "used >= limit" means there is no room left for the next unit of work; "used > limit" means the
// work already done went past the allowance. Tool calls are not checked before a model call: the
// model may still finish with a plain answer, and any tool call it asks for is checked on its own.
// A limit of 0 means no room at all; defaults for unset limits are applied by withBudgetDefaults.
import type { RunBudget } from "./agent.js";
import type { BudgetDimension, RunUsage } from "./run.js";

export interface BudgetCheck {
  readonly exhausted: BudgetDimension;
  readonly limit: number;
  readonly used: number;
}

type Comparison = "at_or_over" | "over";

interface Reading {
  readonly dimension: BudgetDimension;
  readonly limit: number;
  readonly used: number;
}

function readings(budget: RunBudget, usage: RunUsage, elapsedMs: number): readonly Reading[] {
  return [
    { dimension: "wall_clock", limit: budget.maxWallClockMs, used: elapsedMs },
    { dimension: "iterations", limit: budget.maxIterations, used: usage.iterations },
    { dimension: "model_calls", limit: budget.maxModelCalls, used: usage.modelCalls },
    { dimension: "tool_calls", limit: budget.maxToolCalls, used: usage.toolCalls },
    { dimension: "input_tokens", limit: budget.maxInputTokens, used: usage.inputTokens },
    { dimension: "output_tokens", limit: budget.maxOutputTokens, used: usage.outputTokens },
    { dimension: "output_bytes", limit: budget.maxOutputBytes, used: usage.outputBytes },
    { dimension: "cost", limit: budget.maxCostMicroUsd, used: usage.costMicroUsd },
  ];
}

function firstExhausted(
  budget: RunBudget,
  usage: RunUsage,
  elapsedMs: number,
  rules: Readonly<Partial<Record<BudgetDimension, Comparison>>>,
): BudgetCheck | undefined {
  for (const reading of readings(budget, usage, elapsedMs)) {
    const comparison = rules[reading.dimension];
    if (comparison === undefined) continue;
    const hit = comparison === "at_or_over" ? reading.used >= reading.limit : reading.used > reading.limit;
    if (hit) return { exhausted: reading.dimension, limit: reading.limit, used: reading.used };
  }
  return undefined;
}

const BEFORE_MODEL_CALL: Readonly<Partial<Record<BudgetDimension, Comparison>>> = {
  wall_clock: "at_or_over",
  iterations: "at_or_over",
  model_calls: "at_or_over",
  input_tokens: "at_or_over",
  output_tokens: "at_or_over",
  output_bytes: "at_or_over",
  cost: "at_or_over",
};

const BEFORE_TOOL_CALL: Readonly<Partial<Record<BudgetDimension, Comparison>>> = {
  wall_clock: "at_or_over",
  tool_calls: "at_or_over",
  input_tokens: "over",
  output_tokens: "over",
  output_bytes: "at_or_over",
  cost: "over",
};

const OVERRUN: Readonly<Partial<Record<BudgetDimension, Comparison>>> = {
  wall_clock: "at_or_over",
  iterations: "over",
  model_calls: "over",
  tool_calls: "over",
  input_tokens: "over",
  output_tokens: "over",
  output_bytes: "over",
  cost: "over",
};

/** Before a model call: first dimension already at/over its limit, in the documented order, else undefined. */
export function budgetBeforeModelCall(budget: RunBudget, usage: RunUsage, elapsedMs: number): BudgetCheck | undefined {
  return firstExhausted(budget, usage, elapsedMs, BEFORE_MODEL_CALL);
}

/** Before dispatching one more tool call. */
export function budgetBeforeToolCall(budget: RunBudget, usage: RunUsage, elapsedMs: number): BudgetCheck | undefined {
  return firstExhausted(budget, usage, elapsedMs, BEFORE_TOOL_CALL);
}

/** After usage grew (tokens, bytes, cost): the first dimension now past its limit. */
export function budgetOverrun(budget: RunBudget, usage: RunUsage, elapsedMs: number): BudgetCheck | undefined {
  return firstExhausted(budget, usage, elapsedMs, OVERRUN);
}

function groupDigits(value: number): string {
  const [whole = "0", fraction] = String(value).split(".");
  const sign = whole.startsWith("-") ? "-" : "";
  const digits = sign === "" ? whole : whole.slice(1);
  const grouped = digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return fraction === undefined ? `${sign}${grouped}` : `${sign}${grouped}.${fraction}`;
}

function counted(value: number, singular: string, plural: string): string {
  return `${groupDigits(value)} ${value === 1 ? singular : plural}`;
}

function seconds(ms: number): string {
  const value = Math.round(ms / 100) / 10; // one decimal place at most
  return counted(value, "second", "seconds");
}

function usd(microUsd: number): string {
  const dollars = microUsd / 1_000_000;
  // Whole cents print as cents; smaller amounts keep up to six decimals so they never read as $0.00.
  const text = microUsd % 10_000 === 0 ? dollars.toFixed(2) : dollars.toFixed(6).replace(/0+$/, "");
  const [whole = "0", fraction = ""] = text.split(".");
  return `${groupDigits(Number(whole))}.${fraction} USD`;
}

/** A short phrase naming the limit, e.g. "the model-call budget (3 calls)". */
export function describeBudget(check: BudgetCheck): string {
  const limit = check.limit;
  switch (check.exhausted) {
    case "wall_clock":
      return `the wall-clock budget (${seconds(limit)})`;
    case "iterations":
      return `the iteration budget (${counted(limit, "iteration", "iterations")})`;
    case "model_calls":
      return `the model-call budget (${counted(limit, "call", "calls")})`;
    case "tool_calls":
      return `the tool-call budget (${counted(limit, "call", "calls")})`;
    case "input_tokens":
      return `the input-token budget (${counted(limit, "token", "tokens")})`;
    case "output_tokens":
      return `the output-token budget (${counted(limit, "token", "tokens")})`;
    case "output_bytes":
      return `the output-size budget (${counted(limit, "byte", "bytes")})`;
    case "cost":
      return `the cost budget (${usd(limit)})`;
  }
}

const MAX_TOOL_LINES = 8;
const MAX_TOOL_LINE_CHARS = 160;
const MAX_REQUEST_CHARS = 300;

/** Collapses whitespace runs (including line breaks) and clips to `max` characters with an ellipsis. */
function oneLine(text: string, max: number): string {
  const flat = text.replace(/\s+/g, " ").trim();
  const chars = Array.from(flat);
  return chars.length <= max ? flat : `${chars.slice(0, max - 1).join("").trimEnd()}…`;
}

/**
 * The final reply when a budget runs out on human-requested work: what was done, what is left, which
 * limit stopped the run, and an invitation to continue. Counters and state names beyond the limit
 * phrase stay in the ledger.
 */
export function exhaustionReply(input: {
  readonly check: BudgetCheck;
  readonly request: string;
  readonly stepsDone: number;
  readonly toolCallsDone: readonly string[];
}): string {
  const lines: string[] = [`I had to stop before finishing: this run used up ${describeBudget(input.check)}.`, ""];

  const steps = input.stepsDone === 1 ? "1 step" : `${input.stepsDone} steps`;
  const calls = input.toolCallsDone.map((line) => oneLine(line, MAX_TOOL_LINE_CHARS)).filter((line) => line !== "");
  if (input.stepsDone <= 0 && calls.length === 0) {
    lines.push("Done so far: nothing yet.");
  } else if (calls.length === 0) {
    lines.push(`Done so far: ${steps}, without any tool calls.`);
  } else {
    const callCount = calls.length === 1 ? "1 tool call" : `${calls.length} tool calls`;
    lines.push(`Done so far: ${steps}, including ${callCount}:`);
    const shown = calls.length > MAX_TOOL_LINES ? calls.slice(0, MAX_TOOL_LINES - 1) : calls;
    for (const call of shown) lines.push(`- ${call}`);
    if (shown.length < calls.length) lines.push(`- …and ${calls.length - shown.length} more`);
  }

  const request = oneLine(input.request, MAX_REQUEST_CHARS);
  lines.push("", request === "" ? "Still to do: the rest of your request." : `Still to do: the rest of your request, "${request}".`);
  lines.push("", "Reply yes to continue with a fresh budget.");
  return lines.join("\n");
}
