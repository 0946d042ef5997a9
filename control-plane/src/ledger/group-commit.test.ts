import { performance } from "node:perf_hooks";
import { describe, expect, it } from "vitest";
import { groupCommits, rolledBack, type GroupCommitWriter } from "./group-commit.js";

/** A writer the test finishes by hand: what was written, and how (together or alone). */
function manualWriter(fail: (params: string) => Error | undefined = () => undefined) {
  const writes: { kind: "together" | "alone"; params: string[]; finish: () => void }[] = [];
  const rows = (params: string) => {
    const error = fail(params);
    if (error !== undefined) throw error;
    return [`row of ${params}`];
  };
  /** A write the test finishes by hand; as one transaction, one failure fails it all. */
  const pending = <T>(kind: "together" | "alone", params: string[], result: () => T) =>
    new Promise<T>((resolve, reject) =>
      writes.push({
        kind,
        params,
        finish: () => {
          try {
            resolve(result());
          } catch (error) {
            reject(error instanceof Error ? error : new Error(String(error)));
          }
        },
      }),
    );
  const writer: GroupCommitWriter<string, string> = {
    together: (batch) => pending("together", [...batch], () => batch.map(rows)),
    alone: (params) => pending("alone", [params], () => rows(params)),
  };
  return { writer, writes };
}

const settle = <T>(promise: Promise<T>) => promise.then((value) => ({ value }), (error: unknown) => ({ error }));
const tick = () => new Promise((resolve) => setImmediate(resolve));

describe("group commit", () => {
  it("writes a commit at once while a slot is free, and those arriving meanwhile together, in order", async () => {
    const { writer, writes } = manualWriter();
    const commit = groupCommits(writer, { maxInFlight: 1, maxBatch: 32 });
    const first = commit("a");
    const later = ["b", "c", "d"].map((params) => commit(params));
    expect(writes.map((w) => [w.kind, w.params])).toEqual([["alone", ["a"]]]);
    writes[0]!.finish();
    expect(await first).toEqual(["row of a"]);
    await tick();
    expect(writes.map((w) => [w.kind, w.params])).toEqual([
      ["alone", ["a"]],
      ["together", ["b", "c", "d"]],
    ]);
    writes[1]!.finish();
    expect(await Promise.all(later)).toEqual([["row of b"], ["row of c"], ["row of d"]]);
  });

  it("keeps batches within maxBatch and writes maxInFlight of them at once", async () => {
    const { writer, writes } = manualWriter();
    const commit = groupCommits(writer, { maxInFlight: 2, maxBatch: 2 });
    const all = ["a", "b", "c", "d", "e", "f"].map((params) => commit(params));
    expect(writes.map((w) => w.params)).toEqual([["a"], ["b"]]);
    writes[0]!.finish();
    await tick();
    expect(writes.map((w) => w.params)).toEqual([["a"], ["b"], ["c", "d"]]);
    writes[1]!.finish();
    await tick();
    expect(writes.map((w) => w.params)).toEqual([["a"], ["b"], ["c", "d"], ["e", "f"]]);
    writes[2]!.finish();
    writes[3]!.finish();
    expect(await Promise.all(all)).toHaveLength(6);
  });

  it("retries a batch PostgreSQL rolled back one commit at a time: only the bad one fails", async () => {
    const duplicate = Object.assign(new Error("duplicate key value violates unique constraint"), { code: "23505" });
    const { writer, writes } = manualWriter((params) => (params === "c" ? duplicate : undefined));
    const commit = groupCommits(writer, { maxInFlight: 1, maxBatch: 32 });
    const first = commit("a");
    const later = ["b", "c", "d"].map((params) => settle(commit(params)));
    writes[0]!.finish();
    await first;
    await tick();
    writes[1]!.finish();
    await tick();
    // Retried all at once, each on its own.
    expect(writes).toHaveLength(5);
    for (const write of writes.slice(2)) write.finish();
    expect(await Promise.all(later)).toEqual([{ value: ["row of b"] }, { error: duplicate }, { value: ["row of d"] }]);
    expect(writes.map((w) => [w.kind, w.params])).toEqual([
      ["alone", ["a"]],
      ["together", ["b", "c", "d"]],
      ["alone", ["b"]],
      ["alone", ["c"]],
      ["alone", ["d"]],
    ]);
  });

  it("does not retry a batch whose outcome is unknown (the connection was lost): each gets that error", async () => {
    const lost = new Error("Connection terminated unexpectedly");
    const { writer, writes } = manualWriter((params) => (params === "c" ? lost : undefined));
    const commit = groupCommits(writer, { maxInFlight: 1, maxBatch: 32 });
    const first = commit("a");
    const later = ["b", "c"].map((params) => settle(commit(params)));
    writes[0]!.finish();
    await first;
    await tick();
    writes[1]!.finish();
    expect(await Promise.all(later)).toEqual([{ error: lost }, { error: lost }]);
    expect(writes).toHaveLength(2);
  });

  it("polls for the reply of a lone commit that waits for its flush, until it lands or for pollAloneMs at most, and for no other", async () => {
    const { writer: manual, writes } = manualWriter();
    const writer: GroupCommitWriter<string, string> = { ...manual, waitsForFlush: (params) => params.startsWith("flush") };
    /** The share of `ms` the event loop spent working rather than asleep in the kernel. */
    const busyShare = async (ms: number) => {
      const before = performance.eventLoopUtilization();
      await new Promise((resolve) => setTimeout(resolve, ms));
      return performance.eventLoopUtilization(before).utilization;
    };
    const commit = groupCommits(writer, { maxInFlight: 2, maxBatch: 32, pollAloneMs: 1_000 });

    const lone = commit("flush-1");
    expect(await busyShare(60)).toBeGreaterThan(0.8);
    // A second commit goes out while the first is in flight: it is not alone, nothing polls for it.
    const beside = commit("flush-2");
    writes[0]!.finish();
    await lone;
    expect(await busyShare(60)).toBeLessThan(0.5);
    writes[1]!.finish();
    await beside;

    // Alone, but it does not wait for a flush: its reply comes too soon to poll for.
    const quick = commit("async-1");
    expect(await busyShare(60)).toBeLessThan(0.5);
    writes[2]!.finish();
    await quick;

    // Polling gives up after pollAloneMs, though the reply has not come.
    const capped = groupCommits(writer, { maxInFlight: 2, maxBatch: 32, pollAloneMs: 10 });
    const slow = capped("flush-3");
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await busyShare(60)).toBeLessThan(0.5);
    writes[3]!.finish();
    await slow;
  });

  it("tells a rolled-back transaction's errors from the rest", () => {
    for (const code of ["23505", "23503", "40P01", "40001", "55P03", "22P02", "42P01", "P0001"]) expect(rolledBack({ code })).toBe(true);
    for (const code of [undefined, "57P01", "08006", "53300", "ECONNRESET"]) expect(rolledBack({ code })).toBe(false);
    expect(rolledBack(new Error("no code"))).toBe(false);
  });
});
