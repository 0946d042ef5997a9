// The mailbox's loop over a fake store: it asks the models only when the store says the plan
// depends on them, ties each answer to the run it was asked about, and settles with the safe
// fallbacks when the conversation keeps changing under it.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import type { AgentSpec, ScriptedTurn } from "../domain/agent.js";
import { createScriptedModelProvider } from "../models/scripted-model-provider.js";
import type { Admission, AdmissionAnswers, AdmissionAttempt, Admissions, SubmittedMessage } from "./ingress.js";
import { createMailbox } from "./mailbox.js";
import type { SideCallLedger } from "./side-calls.js";
import type { SideModelCall } from "../domain/triage.js";

const turn = (replyText: string): ScriptedTurn => ({ replyText, toolCalls: [], delayMs: 0, inputTokens: 0, outputTokens: 0 });
const agentAnswering = (fast: string, decision: string): AgentSpec => ({
  ...DEMO_AGENT,
  models: { primary: DEMO_AGENT.models.primary, fast: { ...DEMO_AGENT.models.fast, scriptedTurns: [turn(fast)] }, decision: { ...DEMO_AGENT.models.decision, scriptedTurns: [turn(decision)] } },
});

const message: SubmittedMessage = {
  agentId: "demo",
  conversationId: "c",
  actorId: "alice",
  actorDisplayName: "",
  messageId: "m",
  text: "actually, in rust",
  replyToMessageId: undefined,
  connector: "test",
};

function storeScript(steps: ((answers: AdmissionAnswers) => AdmissionAttempt<Admission>)[]): Admissions & { seen: AdmissionAnswers[] } {
  const seen: AdmissionAnswers[] = [];
  return {
    seen,
    admit: (_message, answers) => {
      seen.push(answers);
      const next = steps[Math.min(seen.length - 1, steps.length - 1)]!;
      return Promise.resolve(next(answers));
    },
    edit: () => Promise.reject(new Error("unused")),
    continueRun: () => Promise.reject(new Error("unused")),
  };
}

const done = (runId: string): AdmissionAttempt<Admission> => ({ kind: "done", result: { runId, status: "queued", duplicate: false } });
const mailboxOver = (store: Admissions) =>
  createMailbox({ admissions: store, providers: { scripted: createScriptedModelProvider(), openai: createScriptedModelProvider() }, clock: { now: () => new Date(0) }, log: pino({ level: "silent" }) });

describe("the mailbox", () => {
  it("admits at once when no model question is needed", async () => {
    const store = storeScript([() => done("r1")]);
    expect(await mailboxOver(store).submitMessage(message, new AbortController().signal)).toMatchObject({ runId: "r1" });
    expect(store.seen).toEqual([{}]);
  });

  it("asks the fast model about the run the store named, then passes the answer tied to that run", async () => {
    const agent = agentAnswering("refines", "unclear");
    const store = storeScript([() => ({ kind: "needs_relation", agent, runId: "running", request: "build me a url shortener" }), () => done("successor")]);
    expect(await mailboxOver(store).submitMessage(message, new AbortController().signal)).toMatchObject({ runId: "successor" });
    expect(store.seen[1]?.relation).toMatchObject({ runId: "running", relation: "refines" });
  });

  it("falls back to independent when the fast model answers off the list", async () => {
    const agent = agentAnswering("maybe?", "unclear");
    const store = storeScript([() => ({ kind: "needs_relation", agent, runId: "running", request: "x" }), () => done("queued")]);
    await mailboxOver(store).submitMessage(message, new AbortController().signal);
    expect(store.seen[1]?.relation).toMatchObject({ relation: "independent" });
    expect(store.seen[1]?.relation?.note).toMatch(/fell back/);
  });

  it("asks the decision model for consent, and an off-list answer is unclear", async () => {
    const agent = agentAnswering("independent", "sure thing!");
    const store = storeScript([() => ({ kind: "needs_consent", agent, runId: "exhausted" }), () => done("new")]);
    await mailboxOver(store).submitMessage(message, new AbortController().signal);
    expect(store.seen[1]?.consent).toMatchObject({ runId: "exhausted", answer: "unclear" });
  });

  it("records each question's call against the run it was about, as a decision call with its usage", async () => {
    const recorded: SideModelCall[] = [];
    const sideCalls: SideCallLedger = {
      recordSideCall: (call) => Promise.resolve(void recorded.push(call)),
      recordTriage: () => Promise.reject(new Error("unused")),
    };
    const agent = agentAnswering("refines", "yes");
    const store = storeScript([
      () => ({ kind: "needs_relation", agent, runId: "running", request: "x" }),
      () => ({ kind: "needs_consent", agent, runId: "exhausted" }),
      () => done("after"),
    ]);
    const mailbox = createMailbox({
      admissions: store,
      providers: { scripted: createScriptedModelProvider(), openai: createScriptedModelProvider() },
      clock: { now: () => new Date(0) },
      log: pino({ level: "silent" }),
      sideCalls,
    });
    await mailbox.submitMessage(message, new AbortController().signal);
    expect(recorded.map((c) => [c.runId, c.role, c.purpose, c.responseText, c.finishReason])).toEqual([
      ["running", "decision", "follow_up", "refines", "stop"],
      ["exhausted", "decision", "consent", "yes", "stop"],
    ]);
    expect(recorded.every((c) => c.inputTokens > 0 && c.outputTokens > 0)).toBe(true);
  });

  it("settles with the safe fallbacks when the conversation keeps changing under its answers", async () => {
    const agent = agentAnswering("refines", "yes");
    let n = 0;
    const store = storeScript([
      (answers) => (answers.relation?.relation === "independent" ? done("settled") : { kind: "needs_relation", agent, runId: `run-${++n}`, request: "x" }),
    ]);
    expect(await mailboxOver(store).submitMessage(message, new AbortController().signal)).toMatchObject({ runId: "settled" });
    expect(store.seen.at(-1)?.consent?.answer).toBe("unclear");
  });
});
