import { describe, expect, it } from "vitest";
import { ackKey, cancellationReply, FAILED_ACK, questionDraft, refusedReply, replyKey, settlementDrafts, SUCCEEDED_ACK } from "./settlement.js";

const audience = { runId: "run-1", logicalRequestId: "req-1", replyToMessageId: "m-1", addressedActorIds: ["alice"] };

describe("settlement drafts", () => {
  it("a succeeded run replies and marks its request's ack succeeded", () => {
    const drafts = settlementDrafts(audience, "succeeded", "done");
    expect(drafts).toEqual([
      { kind: "reply", idempotencyKey: "reply:run-1", text: "done", replyToMessageId: "m-1", addressedActorIds: ["alice"] },
      { kind: "ack", idempotencyKey: "ack:req-1:settled", text: SUCCEEDED_ACK, ackState: "succeeded", replyToMessageId: "m-1", addressedActorIds: ["alice"] },
    ]);
  });

  it("any other status without a reply only fails the ack, keyed on the logical request", () => {
    const drafts = settlementDrafts({ ...audience, replyToMessageId: undefined }, "cancelled", undefined);
    expect(drafts).toEqual([{ kind: "ack", idempotencyKey: ackKey("req-1", "settled"), text: FAILED_ACK, ackState: "failed", addressedActorIds: ["alice"] }]);
  });

  it("a cancelled run says what it did only past its commit boundary", () => {
    let asked = 0;
    const done = () => {
      asked += 1;
      return { stepsDone: 2, effects: ["fs.write.v1"] };
    };
    expect(cancellationReply("buffering", "bob", done)).toBeUndefined();
    expect(asked).toBe(0);
    const reply = cancellationReply("committed", "bob", done);
    expect(reply).toContain("as bob asked");
    expect(reply).toContain("- fs.write.v1");
  });

  it("keys are stable per run, request and question", () => {
    expect(replyKey("r")).toBe("reply:r");
    expect(ackKey("q", "working")).toBe("ack:q:working");
    expect(questionDraft({ replyToMessageId: undefined, addressedActorIds: [] }, "inv-1", "why?")).toEqual({
      kind: "question",
      idempotencyKey: "question:inv-1",
      text: "why?",
      addressedActorIds: [],
    });
  });

  it("a guarded reply is refused by a stop or by input newer than it was decided on", () => {
    const control = { cancelRequestedByActorId: undefined, triggerCount: 2 };
    expect(refusedReply(undefined, { ...control, cancelRequestedByActorId: "x" })).toBe(false);
    expect(refusedReply({ triggerCount: 2 }, control)).toBe(false);
    expect(refusedReply({ triggerCount: 1 }, control)).toBe(true);
    expect(refusedReply({ triggerCount: undefined }, control)).toBe(false);
    expect(refusedReply({ triggerCount: undefined }, { ...control, cancelRequestedByActorId: "x" })).toBe(true);
  });
});
