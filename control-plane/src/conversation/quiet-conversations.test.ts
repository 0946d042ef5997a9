import { describe, expect, it } from "vitest";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { QuietConversations, type QuietView } from "./quiet-conversations.js";

const VIEW: QuietView = { conversationId: "conv-1", agent: DEMO_AGENT, earlierProgress: [] };

describe("QuietConversations", () => {
  it("knows nothing of a conversation it never admitted to", () => {
    expect(new QuietConversations().quiet("demo", "c", "m1")).toBeUndefined();
  });

  it("calls a conversation quiet only once every run it left live has ended here", () => {
    const quiet = new QuietConversations();
    quiet.admitted("demo", "c", VIEW, ["r1", "r2"], "m1");
    expect(quiet.quiet("demo", "c", "m2")).toBeUndefined();
    quiet.runEnded("r1", "succeeded");
    expect(quiet.quiet("demo", "c", "m2")).toBeUndefined();
    quiet.runEnded("r2", "failed");
    expect(quiet.quiet("demo", "c", "m2")).toMatchObject({ conversationId: "conv-1" });
    // Another conversation of the same agent is its own.
    expect(quiet.quiet("demo", "other", "m2")).toBeUndefined();
  });

  it("does not guess at a message id it admitted lately (a connector's redelivery)", () => {
    const quiet = new QuietConversations();
    quiet.admitted("demo", "c", VIEW, [], "m1");
    expect(quiet.quiet("demo", "c", "m1")).toBeUndefined();
    expect(quiet.quiet("demo", "c", "m2")).toBeDefined();
  });

  it("counts a conversation busy while a guess for it is being admitted", () => {
    const quiet = new QuietConversations();
    quiet.admitted("demo", "c", VIEW, [], "m1");
    quiet.guessing("demo", "c", "guessed");
    expect(quiet.quiet("demo", "c", "m3")).toBeUndefined();
    // The admission's own record replaces the guess's mark with what its read saw.
    quiet.admitted("demo", "c", VIEW, ["guessed"], "m2");
    quiet.runEnded("guessed", "succeeded");
    expect(quiet.quiet("demo", "c", "m3")).toBeDefined();
  });

  it("forgets a conversation after an exhausted budget, a notice or a failed admission", () => {
    const quiet = new QuietConversations();
    quiet.admitted("demo", "exhausted", VIEW, ["r1"], "m1");
    quiet.runEnded("r1", "budget_exhausted");
    expect(quiet.quiet("demo", "exhausted", "m2")).toBeUndefined();
    expect(quiet.size).toBe(0);

    quiet.admitted("demo", "noticed", VIEW, ["r2"], "m1");
    quiet.noticed("r2");
    quiet.runEnded("r2", "succeeded");
    expect(quiet.quiet("demo", "noticed", "m2")).toBeUndefined();

    quiet.admitted("demo", "failed", VIEW, [], "m1");
    quiet.forgetConversation("demo", "failed");
    expect(quiet.quiet("demo", "failed", "m2")).toBeUndefined();
  });

  it("holds at most its capacity, forgetting the least recently admitted first", () => {
    const quiet = new QuietConversations(2);
    quiet.admitted("demo", "a", VIEW, ["ra"], "m");
    quiet.admitted("demo", "b", VIEW, [], "m");
    quiet.admitted("demo", "a", VIEW, [], "m2");
    quiet.admitted("demo", "c", VIEW, [], "m");
    expect(quiet.size).toBe(2);
    expect(quiet.quiet("demo", "b", "m9")).toBeUndefined();
    expect(quiet.quiet("demo", "a", "m9")).toBeDefined();
    expect(quiet.quiet("demo", "c", "m9")).toBeDefined();
    // A run of a forgotten conversation ending later changes nothing.
    quiet.runEnded("ra", "succeeded");
    expect(quiet.size).toBe(2);
  });

  it("a guess holds only for the same conversation, spec and notices as the read", () => {
    const read: QuietView = JSON.parse(JSON.stringify(VIEW)) as QuietView;
    expect(QuietConversations.holds(VIEW, read)).toBe(true);
    expect(QuietConversations.holds(VIEW, { ...read, conversationId: "conv-2" })).toBe(false);
    expect(QuietConversations.holds(VIEW, { ...read, agent: { ...read.agent, systemPrompt: "changed" } })).toBe(false);
    expect(QuietConversations.holds(VIEW, { ...read, earlierProgress: [{ text: "still working", at: new Date(0) }] })).toBe(false);
  });
});
