import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { RunBudget } from "./agent.js";
import {
  budgetBeforeModelCall,
  budgetBeforeToolCall,
  budgetOverrun,
  describeBudget,
  exhaustionReply,
  type BudgetCheck,
} from "./budget.js";
import { ZERO_USAGE, type BudgetDimension, type RunUsage } from "./run.js";

const budget: RunBudget = {
  maxWallClockMs: 60_000,
  maxIterations: 5,
  maxModelCalls: 3,
  maxToolCalls: 4,
  maxInputTokens: 1_000,
  maxOutputTokens: 500,
  maxOutputBytes: 2_048,
  maxCostMicroUsd: 10_000,
};

function usage(overrides: Partial<RunUsage>): RunUsage {
  return { ...ZERO_USAGE, ...overrides };
}

const usageKey: Record<Exclude<BudgetDimension, "wall_clock">, keyof RunUsage> = {
  iterations: "iterations",
  model_calls: "modelCalls",
  tool_calls: "toolCalls",
  input_tokens: "inputTokens",
  output_tokens: "outputTokens",
  output_bytes: "outputBytes",
  cost: "costMicroUsd",
};

const limitOf: Record<BudgetDimension, number> = {
  wall_clock: budget.maxWallClockMs,
  iterations: budget.maxIterations,
  model_calls: budget.maxModelCalls,
  tool_calls: budget.maxToolCalls,
  input_tokens: budget.maxInputTokens,
  output_tokens: budget.maxOutputTokens,
  output_bytes: budget.maxOutputBytes,
  cost: budget.maxCostMicroUsd,
};

/** Usage and elapsed time with one dimension set to `used` and everything else at zero. */
function usageAt(dimension: BudgetDimension, used: number): [RunUsage, number] {
  if (dimension === "wall_clock") return [ZERO_USAGE, used];
  return [usage({ [usageKey[dimension]]: used }), 0];
}

type Check = typeof budgetBeforeModelCall;

// For each check and dimension: undefined = not checked; "at" = exhausted at the limit; "over" = only past it.
const table: ReadonlyArray<[string, Check, Record<BudgetDimension, "at" | "over" | undefined>]> = [
  [
    "before model call",
    budgetBeforeModelCall,
    {
      wall_clock: "at",
      iterations: "at",
      model_calls: "at",
      tool_calls: undefined,
      input_tokens: "at",
      output_tokens: "at",
      output_bytes: "at",
      cost: "at",
    },
  ],
  [
    "before tool call",
    budgetBeforeToolCall,
    {
      wall_clock: "at",
      iterations: undefined,
      model_calls: undefined,
      tool_calls: "at",
      input_tokens: "over",
      output_tokens: "over",
      output_bytes: "at",
      cost: "over",
    },
  ],
  [
    "overrun",
    budgetOverrun,
    {
      wall_clock: "at",
      iterations: "over",
      model_calls: "over",
      tool_calls: "over",
      input_tokens: "over",
      output_tokens: "over",
      output_bytes: "over",
      cost: "over",
    },
  ],
];

describe("budget checks, one dimension at a time", () => {
  for (const [name, check, rules] of table) {
    for (const [dimension, rule] of Object.entries(rules) as [BudgetDimension, "at" | "over" | undefined][]) {
      it(`${name}: ${dimension} ${rule ?? "not checked"}`, () => {
        const limit = limitOf[dimension];
        expect(check(budget, ...usageAt(dimension, limit - 1))).toBeUndefined();
        const atLimit = check(budget, ...usageAt(dimension, limit));
        const pastLimit = check(budget, ...usageAt(dimension, limit + 1));
        if (rule === undefined) {
          expect(atLimit).toBeUndefined();
          expect(pastLimit).toBeUndefined();
          return;
        }
        expect(pastLimit).toEqual({ exhausted: dimension, limit, used: limit + 1 });
        expect(atLimit).toEqual(rule === "at" ? { exhausted: dimension, limit, used: limit } : undefined);
      });
    }
  }

  it("nothing used means nothing exhausted", () => {
    for (const [, check] of table) expect(check(budget, ZERO_USAGE, 0)).toBeUndefined();
  });

  it("a zero limit leaves no room", () => {
    expect(budgetBeforeModelCall({ ...budget, maxModelCalls: 0 }, ZERO_USAGE, 0)?.exhausted).toBe("model_calls");
    expect(budgetBeforeToolCall({ ...budget, maxToolCalls: 0 }, ZERO_USAGE, 0)?.exhausted).toBe("tool_calls");
  });
});

describe("budget checks report the first dimension in the fixed order", () => {
  const order: readonly BudgetDimension[] = [
    "wall_clock",
    "iterations",
    "model_calls",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "output_bytes",
    "cost",
  ];

  it("everything exhausted → wall_clock wins", () => {
    const all = usage({
      iterations: 99,
      modelCalls: 99,
      toolCalls: 99,
      inputTokens: 99_999,
      outputTokens: 99_999,
      outputBytes: 99_999,
      costMicroUsd: 99_999,
    });
    expect(budgetBeforeModelCall(budget, all, 99_999)?.exhausted).toBe("wall_clock");
    expect(budgetBeforeModelCall(budget, all, 0)?.exhausted).toBe("iterations");
    expect(budgetBeforeToolCall(budget, all, 0)?.exhausted).toBe("tool_calls");
  });

  it("the reported dimension is the earliest exhausted one (property)", () => {
    fc.assert(
      fc.property(fc.subarray([...order]), (exhausted) => {
        let current = ZERO_USAGE;
        let elapsed = 0;
        for (const dimension of exhausted) {
          if (dimension === "wall_clock") elapsed = limitOf.wall_clock + 1;
          else current = { ...current, [usageKey[dimension]]: limitOf[dimension] + 1 };
        }
        expect(budgetOverrun(budget, current, elapsed)?.exhausted).toBe(exhausted[0]);
      }),
    );
  });

  it("dimensions are independent: staying under one limit never hides another", () => {
    fc.assert(
      fc.property(fc.constantFrom(...order), fc.nat({ max: 100 }), (dimension, slack) => {
        // Every other dimension has plenty of room; only `dimension` is past its limit.
        const [used, elapsed] = usageAt(dimension, limitOf[dimension] + 1 + slack);
        expect(budgetOverrun(budget, used, elapsed)?.exhausted).toBe(dimension);
      }),
    );
  });
});

describe("describeBudget", () => {
  const check = (exhausted: BudgetDimension, limit: number): BudgetCheck => ({ exhausted, limit, used: limit });

  it.each([
    [check("model_calls", 3), "the model-call budget (3 calls)"],
    [check("model_calls", 1), "the model-call budget (1 call)"],
    [check("tool_calls", 200), "the tool-call budget (200 calls)"],
    [check("iterations", 50), "the iteration budget (50 iterations)"],
    [check("wall_clock", 900_000), "the wall-clock budget (900 seconds)"],
    [check("wall_clock", 1_500), "the wall-clock budget (1.5 seconds)"],
    [check("wall_clock", 1_000), "the wall-clock budget (1 second)"],
    [check("input_tokens", 2_000_000), "the input-token budget (2,000,000 tokens)"],
    [check("output_tokens", 200_000), "the output-token budget (200,000 tokens)"],
    [check("output_bytes", 16_777_216), "the output-size budget (16,777,216 bytes)"],
    [check("cost", 5_000_000), "the cost budget (5.00 USD)"],
    [check("cost", 1_234_560_000), "the cost budget (1,234.56 USD)"],
    [check("cost", 1_500), "the cost budget (0.0015 USD)"],
  ])("%j → %s", (input, expected) => {
    expect(describeBudget(input)).toBe(expected);
  });
});

describe("exhaustionReply", () => {
  const stop: BudgetCheck = { exhausted: "model_calls", limit: 3, used: 3 };

  it("says what was done, what remains, which limit, and asks to continue", () => {
    const reply = exhaustionReply({
      check: stop,
      request: "Fix the flaky test in billing and open a PR",
      stepsDone: 3,
      toolCallsDone: ["read billing/test_invoice.py", "ran the billing tests (2 failures)"],
    });
    expect(reply).toBe(
      [
        "I had to stop before finishing: this run used up the model-call budget (3 calls).",
        "",
        "Done so far: 3 steps, including 2 tool calls:",
        "- read billing/test_invoice.py",
        "- ran the billing tests (2 failures)",
        "",
        'Still to do: the rest of your request, "Fix the flaky test in billing and open a PR".',
        "",
        "Reply yes to continue with a fresh budget.",
      ].join("\n"),
    );
  });

  it("handles a run that did nothing yet", () => {
    const reply = exhaustionReply({ check: stop, request: "hello", stepsDone: 0, toolCallsDone: [] });
    expect(reply).toContain("Done so far: nothing yet.");
    expect(reply.endsWith("Reply yes to continue with a fresh budget.")).toBe(true);
  });

  it("handles steps without tool calls and singular counts", () => {
    const reply = exhaustionReply({ check: stop, request: "hello", stepsDone: 1, toolCallsDone: [] });
    expect(reply).toContain("Done so far: 1 step, without any tool calls.");
  });

  it("summarizes long tool-call lists and clips the request", () => {
    const calls = Array.from({ length: 40 }, (_, i) => `call number ${i}\nwith a second line`);
    const reply = exhaustionReply({ check: stop, request: "x".repeat(1_000), stepsDone: 12, toolCallsDone: calls });
    const bullets = reply.split("\n").filter((line) => line.startsWith("- "));
    expect(bullets.length).toBeLessThanOrEqual(10);
    expect(bullets.at(-1)).toBe("- …and 33 more");
    expect(reply).toContain("- call number 0 with a second line");
    expect(reply).toContain("40 tool calls");
    const quoted = /"(x+…)"/.exec(reply)?.[1] ?? "";
    expect(Array.from(quoted).length).toBe(300);
  });

  it("stays short and free of internal labels for any input (property)", () => {
    fc.assert(
      fc.property(
        fc.constantFrom<BudgetDimension>("wall_clock", "iterations", "model_calls", "tool_calls", "cost"),
        fc.string({ maxLength: 2_000 }),
        fc.nat({ max: 1_000 }),
        fc.array(fc.string({ maxLength: 500 }), { maxLength: 50 }),
        (exhausted, request, stepsDone, toolCallsDone) => {
          const reply = exhaustionReply({ check: { exhausted, limit: 10, used: 10 }, request, stepsDone, toolCallsDone });
          expect(reply.split("\n").length).toBeLessThanOrEqual(20);
          expect(reply).toContain("Reply yes to continue with a fresh budget.");
          expect(reply).not.toMatch(/budget_exhausted|awaiting_|model_calls|tool_calls|wall_clock/);
        },
      ),
    );
  });
});
