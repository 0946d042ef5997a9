import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { Clock } from "../domain/clock.js";
import type { ProgressCandidate } from "../domain/progress.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { createProgressSupervisors, type NoticeReservation, type ProgressLedger, type ProgressSnapshot, type SupervisedRun } from "./progress-supervisor.js";

class ManualClock implements Clock {
  constructor(private at = 0) {}
  now(): Date {
    return new Date(this.at);
  }
  advance(ms: number): void {
    this.at += ms;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (condition()) return;
    await sleep(5);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** A ledger in memory whose reservations the test completes by hand. */
function fakeLedger() {
  const notices: NoticeReservation[] = [];
  const pending: { notice: NoticeReservation; settle: (ok: boolean) => void }[] = [];
  const candidates: ProgressCandidate[] = [];
  /** While set, a load reads the ledger at once but answers only when the test lets it. */
  const loads = { gated: false, waiting: [] as (() => void)[] };
  const ledger: ProgressLedger = {
    load(): Promise<ProgressSnapshot> {
      const last = notices.at(-1);
      const covered = new Set(notices.flatMap((n) => n.covers));
      const snapshot: ProgressSnapshot = {
        subject: "req",
        triage: "default",
        ackText: undefined,
        lastSeq: notices.length,
        lastNoticeAt: last?.at,
        candidates: candidates.filter((c) => !covered.has(c.ref)),
        activity: { kind: "unknown" },
      };
      if (!loads.gated) return Promise.resolve(snapshot);
      return new Promise((resolve) => loads.waiting.push(() => resolve(snapshot)));
    },
    reserve(notice) {
      return new Promise<boolean>((resolve) => {
        pending.push({
          notice,
          settle: (ok) => {
            if (ok) notices.push(notice);
            resolve(ok);
          },
        });
      });
    },
  };
  return { ledger, notices, pending, candidates, loads };
}

function run(signal: AbortSignal): SupervisedRun {
  return {
    runId: "run-1",
    epoch: 1,
    workerId: "w",
    startedAt: new Date(0),
    replyToMessageId: undefined,
    addressedActorIds: [],
    agent: DEMO_AGENT,
    requestText: "a long task",
    cadence: undefined,
    signal,
  };
}

describe("progress supervisor", () => {
  it("holds notices while the reply commits: a reservation in flight first, none started meanwhile", async () => {
    const clock = new ManualClock();
    const { ledger, notices, pending } = fakeLedger();
    const supervisors = createProgressSupervisors({ ledger, clock, log: pino({ level: "silent" }), options: { tickMs: 5 } });
    const progress = supervisors.supervise(run(new AbortController().signal));
    clock.advance(60_000);
    await until(() => pending.length === 1, "the first reservation");
    let held = false;
    const holding = progress.hold().then((release) => {
      held = true;
      return release;
    });
    await sleep(30);
    expect(held).toBe(false);
    pending[0]!.settle(true);
    const release = await holding;
    // While held, a due notice is not even attempted.
    clock.advance(180_000);
    await sleep(50);
    expect(pending).toHaveLength(1);
    release();
    await until(() => pending.length === 2, "the next reservation after the release");
    pending[1]!.settle(true);
    await progress.stop();
    clock.advance(600_000);
    await sleep(50);
    expect(pending).toHaveLength(2);
    expect(notices.map((n) => [n.seq, n.source, n.idempotencyKey])).toEqual([
      [1, "deadline", "progress:req:1"],
      [2, "deadline", "progress:req:2"],
    ]);
  });

  it("stops when the claim's signal aborts (lease lost), and stop() joins at once", async () => {
    const clock = new ManualClock();
    const { ledger, pending } = fakeLedger();
    const supervisors = createProgressSupervisors({ ledger, clock, log: pino({ level: "silent" }), options: { tickMs: 5 } });
    const claim = new AbortController();
    const progress = supervisors.supervise(run(claim.signal));
    await sleep(20);
    claim.abort(new Error("lease lost"));
    clock.advance(600_000);
    await sleep(50);
    expect(pending).toHaveLength(0);
    await progress.stop();
  });

  it("a refused reservation (a stale claim) is not retried in a tight loop", async () => {
    const clock = new ManualClock();
    const { ledger, pending } = fakeLedger();
    const supervisors = createProgressSupervisors({ ledger, clock, log: pino({ level: "silent" }), options: { tickMs: 5_000 } });
    const progress = supervisors.supervise(run(new AbortController().signal));
    clock.advance(60_000);
    await until(() => pending.length === 1, "the first reservation");
    pending[0]!.settle(false);
    // The next look is a tick (5 s) away, however loaded the machine.
    await sleep(100);
    expect(pending).toHaveLength(1);
    await progress.stop();
  });

  it("a checkpoint announced while a look at the ledger is in flight is not lost until the cadence", async () => {
    const clock = new ManualClock();
    const { ledger, pending, candidates, loads } = fakeLedger();
    const supervisors = createProgressSupervisors({ ledger, clock, log: pino({ level: "silent" }), options: { tickMs: 5 } });
    loads.gated = true;
    const progress = supervisors.supervise(run(new AbortController().signal));
    await until(() => loads.waiting.length === 1, "the first look");
    // The checkpoint commits and is announced after the look read the ledger, before it answers.
    candidates.push({ ref: "call-1", kind: "plan", text: "read the parser" });
    supervisors.checkpoint("run-1");
    loads.gated = false;
    loads.waiting.shift()!();
    // The clock stands still: only the announcement can bring the notice.
    await until(() => pending.length === 1, "the checkpoint's notice");
    expect(pending[0]!.notice).toMatchObject({ source: "checkpoint", covers: ["call-1"] });
    pending[0]!.settle(true);
    await progress.stop();
  });
});
