import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import type { AgentSpec } from "../domain/agent.js";
import { withBudgetDefaults } from "../domain/agent.js";
import { LeaseLostError } from "../domain/errors.js";
import { FAILED_ACK, SUCCEEDED_ACK } from "../domain/settlement.js";
import type { ModelTurn } from "../domain/transcript.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { toolGrants } from "../fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../models/model-provider.js";
import { createToolRegistry, defineTool, type ToolExecutionContext, type ToolRegistry, type ToolResult } from "../tools/tool-registry.js";
import { InMemoryRunStore } from "./in-memory-run-store.js";
import { advanceRun, type RunnerDeps } from "./runner.js";

const READ = "test.read.v1";
const WRITE = "test.write.v1";

const reply = (text: string): ModelTurn => ({ text, toolCalls: [], usage: { inputTokens: 1, outputTokens: 1 }, finishReason: "stop" });
const calls = (...named: readonly (readonly [string, Record<string, unknown>])[]): ModelTurn => ({
  text: "",
  toolCalls: named.map(([name, args], i) => ({ id: `call_${i}`, name, argumentsJson: JSON.stringify(args) })),
  usage: { inputTokens: 1, outputTokens: 1 },
  finishReason: "tool_calls",
});

/** Plays `turns` in order; `during` runs inside the call, as if something happened while the model was thinking. */
function model(turns: readonly ModelTurn[], during?: (request: ModelRequest) => void): ModelProvider & { readonly calls: ModelRequest[] } {
  const seen: ModelRequest[] = [];
  return {
    calls: seen,
    complete(request) {
      seen.push(request);
      during?.(request);
      return Promise.resolve(turns[Math.min(request.callIndex, turns.length - 1)]!);
    },
    decide: () => Promise.reject(new Error("not used")),
  };
}

type Exec = (args: Record<string, unknown>, context: ToolExecutionContext) => Promise<ToolResult>;

/** A read and a write tool whose executions are recorded, and whose behaviour a test may replace. */
function testTools(overrides: { read?: Exec; write?: Exec; lookup?: () => Promise<"applied" | "not_applied" | "unknown"> } = {}) {
  const executed: string[] = [];
  const tool = (name: string, effect: "read" | "write", exec: Exec | undefined) =>
    defineTool<{ path: string }>({
      name,
      version: 1,
      description: `${effect} a path`,
      parameters: z.object({ path: z.string() }),
      effect,
      async execute(args, context) {
        executed.push(`${name}:${args.path}`);
        if (exec !== undefined) return exec(args, context);
        await context.observe("stdout", `${effect} ${args.path}`);
        return { ok: true, text: `${effect} ${args.path}: ok` };
      },
      ...(effect === "write" && overrides.lookup !== undefined ? { lookup: overrides.lookup } : {}),
    });
  const registry = createToolRegistry([tool("test.read", "read", overrides.read), tool("test.write", "write", overrides.write)]);
  return { registry, executed };
}

function agent(overrides: Partial<AgentSpec> = {}): AgentSpec {
  return { ...DEMO_AGENT, id: "test-agent", tools: toolGrants([READ, WRITE]), ...overrides };
}

function deps(store: InMemoryRunStore, provider: ModelProvider, tools: ToolRegistry): RunnerDeps {
  return { store, providers: { scripted: provider, openai: provider }, tools, now: () => new Date(1_000), log: pino({ level: "silent" }), maxInvalidTurns: 3, readFlushMs: 0 };
}

async function drive(store: InMemoryRunStore, provider: ModelProvider, tools = testTools().registry): Promise<void> {
  await advanceRun(deps(store, provider, tools), store.claim(), { workerId: "worker-1", signal: new AbortController().signal });
}

/** A worker commits `turn`'s intents and dies in the middle of the first call; its lease then expires. */
async function dieMidCall(store: InMemoryRunStore, turn: ModelTurn): Promise<void> {
  const hang = testTools({ read: () => new Promise<never>(() => {}), write: () => new Promise<never>(() => {}) });
  void advanceRun(deps(store, model([turn]), hang.registry), store.claim(), { workerId: "worker-1", signal: new AbortController().signal });
  await new Promise((resolve) => setImmediate(resolve));
  expect(hang.executed).toHaveLength(1);
  store.stealLease();
}

const keys = (store: InMemoryRunStore) => store.emissions.map((e) => `${e.kind}:${e.text.slice(0, 40)}`);

describe("the run driver", () => {
  it("settles a turn with a reply: succeeded, the reply sent and the ack marked done", async () => {
    const store = new InMemoryRunStore(agent());
    await drive(store, model([reply("the answer")]));
    expect(store.status).toBe("succeeded");
    expect(store.finalReply).toBe("the answer");
    expect(store.steps).toHaveLength(1);
    expect(store.emissions.map((e) => e.idempotencyKey)).toEqual([`reply:${store.runId}`, `ack:${store.runId}:settled`]);
    expect(store.emissions[1]!.text).toBe(SUCCEEDED_ACK);
    expect(store.leaseOwner).toBeUndefined();
  });

  it("commits a read call's intent before running it, then its outcome, then takes the next turn", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      read: (args) => {
        // The intent is durable before the tool runs.
        expect(store.invocation(READ)?.status).toBe("pending");
        return Promise.resolve({ ok: true, text: `contents of ${String(args.path)}` });
      },
    });
    await drive(store, model([calls([READ, { path: "a.txt" }]), reply("done")]), tools.registry);
    expect(tools.executed).toEqual(["test.read:a.txt"]);
    expect(store.commits.map((c) => `${c.kind}:${c.status}`)).toEqual(["step:awaiting_tool", "outcome:running", "step:succeeded"]);
    expect(store.invocation(READ)).toMatchObject({ status: "succeeded", resultText: "contents of a.txt" });
    expect(store.commitBoundary).toBe("buffering");
    expect(store.steps[0]!.replayability).toBe("replayable");
    expect(store.status).toBe("succeeded");
  });

  it("moves the run past its commit boundary with the step that holds a write intent", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      write: () => {
        expect(store.commitBoundary).toBe("committed");
        return Promise.resolve({ ok: true, text: "written" });
      },
    });
    await drive(store, model([calls([WRITE, { path: "out" }]), reply("wrote it")]), tools.registry);
    expect(tools.executed).toEqual(["test.write:out"]);
    expect(store.steps[0]!.replayability).toBe("not_replayable");
    expect(store.invocation(WRITE)?.status).toBe("succeeded");
    expect(store.status).toBe("succeeded");
  });

  it("numbers a call's observations through the store, its result after them", async () => {
    const store = new InMemoryRunStore(agent());
    await drive(store, model([calls([READ, { path: "x" }]), reply("ok")]));
    const id = store.invocation(READ)!.id;
    expect(store.observations.filter((o) => o.invocationId === id).map((o) => [o.seq, o.stream])).toEqual([
      [1, "stdout"],
      [2, "result"],
    ]);
  });

  it("recovers a read a dead worker left pending as interrupted, without running it again", async () => {
    const store = new InMemoryRunStore(agent());
    await dieMidCall(store, calls([READ, { path: "a" }]));
    expect(store.invocation(READ)?.status).toBe("pending");
    const second = testTools();
    await drive(store, model([reply("answered anyway")]), second.registry);
    expect(second.executed).toEqual([]);
    expect(store.invocation(READ)?.status).toBe("interrupted");
    expect(store.status).toBe("succeeded");
  });

  it("recovers a pending write as an unknown outcome and waits for an operator, never replaying it", async () => {
    const store = new InMemoryRunStore(agent());
    await dieMidCall(store, calls([WRITE, { path: "a" }]));
    const resumed = testTools();
    const provider = model([reply("should not be asked")]);
    await drive(store, provider, resumed.registry);
    expect(resumed.executed).toEqual([]);
    expect(provider.calls).toHaveLength(0);
    expect(store.invocation(WRITE)?.status).toBe("unknown_outcome");
    expect(store.status).toBe("waiting");
    expect(store.waitReason).toBe("unknown_write_outcome");
    expect(store.emissions).toEqual([]);
  });

  it("settles a recovered write by the tool's own lookup and goes on", async () => {
    const store = new InMemoryRunStore(agent());
    await dieMidCall(store, calls([WRITE, { path: "a" }]));
    await drive(store, model([reply("it was applied")]), testTools({ lookup: () => Promise.resolve("applied") }).registry);
    expect(store.invocation(WRITE)).toMatchObject({ status: "unknown_outcome", resolvedOutcome: "applied" });
    expect(store.status).toBe("succeeded");
  });

  it("stops at the first refused commit when another worker took the lease, writing nothing more", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      read: () => {
        store.stealLease();
        return Promise.resolve({ ok: true, text: "late" });
      },
    });
    const provider = model([calls([READ, { path: "a" }], [READ, { path: "b" }]), reply("never")]);
    await expect(drive(store, provider, tools.registry)).rejects.toBeInstanceOf(LeaseLostError);
    expect(tools.executed).toEqual(["test.read:a"]);
    expect(store.invocation(READ)?.status).toBe("pending");
    expect(provider.calls).toHaveLength(1);
    expect(store.emissions).toEqual([]);
  });

  it("hands a paused run back at its next safe point", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      read: () => {
        store.paused = true;
        return Promise.resolve({ ok: true, text: "read" });
      },
    });
    const provider = model([calls([READ, { path: "a" }]), reply("never")]);
    await drive(store, provider, tools.registry);
    expect(store.status).toBe("queued");
    expect(store.leaseOwner).toBeUndefined();
    expect(provider.calls).toHaveLength(1);
  });

  it("exhausts the budget before a model call it has no room for, and says so", async () => {
    const store = new InMemoryRunStore(agent({ budget: withBudgetDefaults({ maxIterations: 1 }) }));
    const provider = model([calls([READ, { path: "a" }]), reply("never")]);
    await drive(store, provider);
    expect(provider.calls).toHaveLength(1);
    expect(store.status).toBe("budget_exhausted");
    expect(store.exhaustedDimension).toBe("iterations");
    expect(store.emissions.map((e) => e.kind)).toEqual(["reply", "ack"]);
    expect(store.emissions[1]!.text).toBe(FAILED_ACK);
  });

  it("refuses the step's other calls once it is cancelled, and ends with a failed ack only before its commit boundary", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      read: () => {
        store.cancelRequestedByActorId = "bob";
        return Promise.resolve({ ok: true, text: "read" });
      },
    });
    await drive(store, model([calls([READ, { path: "a" }], [READ, { path: "b" }])]), tools.registry);
    expect(tools.executed).toEqual(["test.read:a"]);
    expect(store.steps[0]!.invocations[1]).toMatchObject({ status: "refused", refusalReason: "not run: the run was cancelled by bob" });
    expect(store.status).toBe("cancelled");
    expect(keys(store)).toEqual([`ack:${FAILED_ACK}`]);
  });

  it("tells the requester what was done when cancelled past its commit boundary", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      write: () => {
        store.cancelRequestedByActorId = "bob";
        return Promise.resolve({ ok: true, text: "written" });
      },
    });
    await drive(store, model([calls([WRITE, { path: "a" }]), reply("never")]), tools.registry);
    expect(store.status).toBe("cancelled");
    expect(store.emissions.map((e) => e.kind)).toEqual(["reply", "ack"]);
    expect(store.emissions[0]!.text).toContain("as bob asked");
    expect(store.emissions[0]!.text).toContain(`- ${WRITE}`);
  });

  it("does not commit a reply the model wrote while the run was cancelled", async () => {
    const store = new InMemoryRunStore(agent());
    await drive(
      store,
      model([reply("too late")], () => {
        store.cancelRequestedByActorId = "bob";
      }),
    );
    expect(store.status).toBe("cancelled");
    expect(store.finalReply).toBeUndefined();
    expect(store.steps).toHaveLength(0);
    expect(keys(store)).toEqual([`ack:${FAILED_ACK}`]);
  });

  it("ends a superseded run silently: its calls refused, no reply and no ack", async () => {
    const store = new InMemoryRunStore(agent());
    const tools = testTools({
      read: () => {
        store.cancelRequestedByActorId = "alice";
        store.supersededByRunId = "successor";
        return Promise.resolve({ ok: true, text: "read" });
      },
    });
    await drive(store, model([calls([READ, { path: "a" }], [READ, { path: "b" }])]), tools.registry);
    expect(tools.executed).toEqual(["test.read:a"]);
    expect(store.steps[0]!.invocations[1]).toMatchObject({ status: "refused", refusalReason: "not run: the run was superseded by run successor" });
    expect(store.status).toBe("cancelled");
    expect(store.commits.at(-1)?.summary).toBe("superseded by run successor");
    expect(store.emissions).toEqual([]);
  });

  it("fails the run after too many invalid turns in a row", async () => {
    const store = new InMemoryRunStore(agent());
    await drive(store, model([calls(["test.missing.v1", {}])]));
    expect(store.status).toBe("failed");
    expect(store.steps).toHaveLength(3);
    expect(store.steps.every((s) => s.invocations[0]?.status === "refused")).toBe(true);
    expect(store.error).toContain("3 invalid turns");
  });
});
