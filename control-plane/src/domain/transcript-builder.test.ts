import { describe, expect, it } from "vitest";
import { buildTranscript, type TranscriptStep } from "./transcript-builder.js";

const step = (id: string, result: string): TranscriptStep => ({
  responseText: "",
  toolCalls: [{ id, name: "test.echo.v1", argumentsJson: "{}" }],
  invocations: [
    { providerCallId: id, toolName: "test.echo.v1", status: "succeeded", resultText: result, refusalReason: undefined, resolvedOutcome: undefined, resolvedByActorId: undefined, resolutionReason: undefined },
  ],
  feedback: undefined,
});

const roles = (messages: ReturnType<typeof buildTranscript>) => messages.map((m) => `${m.role}:${m.content}`);

describe("buildTranscript", () => {
  it("shows an amendment after the steps that were committed when it arrived", () => {
    const messages = buildTranscript({
      systemPrompt: "",
      requests: [
        { actorId: "alice", text: "deploy it" },
        { actorId: "alice", text: "use blue", afterStep: 1 },
      ],
      steps: [step("a", "one"), step("b", "two")],
    });
    expect(roles(messages)).toEqual(["user:deploy it", "assistant:", "tool:one", "user:use blue", "assistant:", "tool:two"]);
  });

  it("puts inherited requests and work first, then the message that superseded them", () => {
    const messages = buildTranscript({
      systemPrompt: "sys",
      requests: [{ actorId: "alice", text: "actually, in rust" }],
      steps: [],
      inherited: { requests: [{ actorId: "alice", text: "build me a url shortener" }], steps: [step("p_a", "researched")] },
    });
    expect(roles(messages)).toEqual(["system:sys", "user:build me a url shortener", "assistant:", "tool:researched", "user:actually, in rust"]);
  });

  it("names actors when several asked, and marks edits and continuation consent", () => {
    const messages = buildTranscript({
      systemPrompt: "",
      requests: [
        { actorId: "bob", text: "in french", relation: "edit" },
        { actorId: "alice", text: "yes", relation: "continues" },
      ],
      steps: [],
      inherited: { requests: [{ actorId: "alice", text: "summarize" }], steps: [] },
    });
    expect(messages.map((m) => m.content)).toEqual([
      "alice: summarize",
      "bob: (edited message) in french",
      expect.stringMatching(/^alice: \[keel\] .*fresh budget was granted: yes$/),
    ]);
  });

  it("an amendment that arrived before any step goes with the request", () => {
    const messages = buildTranscript({ systemPrompt: "", requests: [{ actorId: "a", text: "x" }, { actorId: "a", text: "y", afterStep: 5 }], steps: [] });
    expect(roles(messages)).toEqual(["user:x", "user:y"]);
  });
  it("shows a follow-up the three latest progress records first, labelled as progress and not as replies", () => {
    const at = (minute: number) => new Date(Date.UTC(2026, 11, 1, 9, minute));
    const messages = buildTranscript({
      systemPrompt: "sys",
      requests: [{ actorId: "alice", text: "and now?" }],
      steps: [],
      progress: [
        { text: "Plan: read the parser", at: at(1) },
        { text: "Done so far: found the bug", at: at(2) },
        { text: "Still on it: running the tests", at: at(5) },
        { text: "Waiting: an answer from bob", at: at(8) },
      ],
    });
    expect(messages.map((m) => m.role)).toEqual(["system", "user", "user"]);
    expect(messages.some((m) => m.role === "assistant")).toBe(false);
    const context = messages[1]?.content ?? "";
    expect(context).toMatch(/^\[keel\] Progress records: the 3 most recent progress notices/);
    expect(context).toMatch(/status updates, not replies/);
    expect(context.split("\n").slice(1)).toEqual([
      "- [progress 2026-12-01T09:02:00.000Z] Done so far: found the bug",
      "- [progress 2026-12-01T09:05:00.000Z] Still on it: running the tests",
      "- [progress 2026-12-01T09:08:00.000Z] Waiting: an answer from bob",
    ]);
    expect(messages[2]?.content).toBe("and now?");
    // Without records nothing is added.
    expect(buildTranscript({ systemPrompt: "", requests: [{ actorId: "a", text: "hi" }], steps: [], progress: [] }).map((m) => m.role)).toEqual(["user"]);
  });
});

describe("buildTranscript with the caller's built step messages", () => {
  it("builds each step once, hands back the same messages for it, and rebuilds a step replaced by a settled call", () => {
    const built = new WeakMap<TranscriptStep, readonly ReturnType<typeof buildTranscript>[number][]>();
    const first = step("call_1", "one");
    const pending: TranscriptStep = { ...step("call_2", ""), invocations: [{ ...step("call_2", "").invocations[0]!, status: "pending", resultText: undefined }] };
    const input = { systemPrompt: "sys", requests: [{ actorId: "ana", text: "go" }], stepMessages: built };
    const before = buildTranscript({ ...input, steps: [first, pending] });
    const settled = step("call_2", "two");
    const after = buildTranscript({ ...input, steps: [first, settled] });

    // The same as built without the map, turn by turn.
    expect(before).toEqual(buildTranscript({ systemPrompt: "sys", requests: input.requests, steps: [first, pending] }));
    expect(after).toEqual(buildTranscript({ systemPrompt: "sys", requests: input.requests, steps: [first, settled] }));
    // The unchanged step's messages are the very objects of the turn before; the replaced step's are new.
    expect(after[2]).toBe(before[2]);
    expect(after[3]).toBe(before[3]);
    expect(after[5]).not.toBe(before[5]);
    expect(roles(before).slice(4)).toEqual(["assistant:", "tool:Pending: no result yet."]);
    expect(roles(after).slice(4)).toEqual(["assistant:", "tool:two"]);
  });
});
