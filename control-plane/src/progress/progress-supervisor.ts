// The progress supervisor: one loop per claimed root run, beside its model and tool calls, that
// says something in the thread when a long run has been quiet too long. It keeps nothing the
// ledger does not: what was last said, and when, is read back from progress_events, so a worker
// that takes a run over (or a restarted process) keeps the cadence. The rules are
// domain/progress.ts; the ledger side is ledger/progress.repository.ts.
import type { Logger } from "pino";
import type { AgentSpec } from "../domain/agent.js";
import type { Clock } from "../domain/clock.js";
import {
  activityText,
  nextNotice,
  noticeText,
  progressCadence,
  progressKey,
  type ProgressActivity,
  type ProgressCadence,
  type ProgressCandidate,
  type ProgressSource,
  type ProgressState,
} from "../domain/progress.js";
import { TRIAGE_TIMEOUT_MS, type TriageDuration } from "../domain/triage.js";
import type { ProgressSummarizer } from "./progress-summary.js";

/** Why a run's supervision stops (given, so no AbortError and its stack trace is built per run). */
const RUN_LEFT = new Error("the run's claim ended");

/** What the ledger holds about a subject's progress and its run's current activity. */
export interface ProgressSnapshot {
  /** Whose cadence the run keeps: its logical request, or the first one of its chain of continuations. */
  readonly subject: string;
  readonly triage: TriageDuration | undefined;
  readonly ackText: string | undefined;
  readonly lastSeq: number;
  readonly lastNoticeAt: Date | undefined;
  /** Candidates no notice has covered yet, oldest first. */
  readonly candidates: readonly ProgressCandidate[];
  readonly activity: ProgressActivity;
}

export interface NoticeReservation {
  readonly runId: string;
  readonly epoch: number;
  readonly workerId: string;
  readonly subject: string;
  readonly seq: number;
  readonly source: ProgressSource;
  readonly covers: readonly string[];
  readonly text: string;
  readonly at: Date;
  readonly idempotencyKey: string;
  readonly replyToMessageId: string | undefined;
  readonly addressedActorIds: readonly string[];
}

/** The ledger's side (ledger/progress.repository.ts). */
export interface ProgressLedger {
  load(runId: string): Promise<ProgressSnapshot | undefined>;
  /**
   * Reserves the notice and its emission in one fenced transaction: only while the run is live,
   * held at `epoch` by `workerId`, neither cancelled nor superseded, and (subject, seq) is free.
   */
  reserve(notice: NoticeReservation): Promise<boolean>;
}

/** A claim of a root run, as the supervisor needs it. */
export interface SupervisedRun {
  readonly runId: string;
  readonly epoch: number;
  readonly workerId: string;
  /** When the silence began. */
  readonly startedAt: Date;
  readonly replyToMessageId: string | undefined;
  readonly addressedActorIds: readonly string[];
  /** The run's agent (its fast model words a notice) and what was asked. */
  readonly agent: AgentSpec;
  readonly requestText: string;
  /** The agent's cadence setting, which may only lower the delays. */
  readonly cadence: Partial<ProgressCadence> | undefined;
  /** The claim's signal: lease loss or shutdown stops the supervisor. */
  readonly signal: AbortSignal;
}

/** One run's supervisor, as the runner holds it. */
export interface RunProgress {
  /**
   * Keeps notices back while the run commits its reply: waits for a reservation in flight and
   * returns the release. A notice reserved after a settled run's commit is refused by the fence.
   */
  hold(): Promise<() => void>;
  /** Stops the loop and waits for it (and any reservation in flight) to finish. */
  stop(): Promise<void>;
}

export interface ProgressSupervisors {
  supervise(run: SupervisedRun): RunProgress;
}

/** Where keel.report_progress.v1 says a checkpoint was committed: the run's supervisor looks now. */
export interface ProgressCheckpoints {
  checkpoint(runId: string): void;
}

export interface ProgressOptions {
  /** Lowers the cadence (tests, demos); it can never switch progress off. */
  readonly cadence?: Partial<ProgressCadence>;
  /** Longest real-time sleep between looks at the clock (a manual clock moves without timers). */
  readonly tickMs?: number;
}

export interface ProgressDeps {
  readonly ledger: ProgressLedger;
  readonly clock: Clock;
  readonly log: Logger;
  readonly options?: ProgressOptions;
  /** The fast model's line for cadence notices without a checkpoint; without it, the facts. */
  readonly summarizer?: ProgressSummarizer;
  /** Told of a run each time a notice is about to be reserved for it: its conversation's latest notices change. */
  readonly noticing?: (runId: string) => void;
}

const DEFAULT_TICK_MS = 1_000;
/** The first look at the ledger: a triage `long` ack goes out this late at most. */
const FIRST_LOOK_MS = 250;

export function createProgressSupervisors(deps: ProgressDeps): ProgressSupervisors & ProgressCheckpoints {
  const tickMs = Math.max(5, deps.options?.tickMs ?? DEFAULT_TICK_MS);
  const pokes = new Map<string, () => void>();
  const alarms = createAlarms(deps.clock, tickMs);

  return {
    checkpoint(runId) {
      pokes.get(runId)?.();
    },
    supervise(run) {
      const cadence = progressCadence(deps.options?.cadence, run.cadence);
      const log = deps.log.child({ runId: run.runId, epoch: run.epoch });
      let stopped = false;
      let held = 0;
      let reserving: Promise<unknown> = Promise.resolve();
      let wake: (() => void) | undefined;
      let dirty = true;
      /** A poke since the last look began: the next wait ends at once, since that look may have missed it. */
      let poked = false;
      const poke = (): void => {
        dirty = true;
        poked = true;
        wake?.();
      };
      const stopping = new AbortController();
      const stopNow = (): void => {
        stopped = true;
        stopping.abort(RUN_LEFT);
        wake?.();
      };
      pokes.set(run.runId, poke);
      if (run.signal.aborted) stopNow();
      else run.signal.addEventListener("abort", stopNow, { once: true });
      /**
       * Waits until `arm`'s ring, a poke or a stop (stopped already: not at all). `arm` sets the
       * ring going and returns how to call it off.
       */
      const waitFor = (arm: (ring: () => void) => () => void): Promise<void> =>
        new Promise((resolve) => {
          // Stopped, or poked while the loop was busy reading: no waiting.
          if (stopped || poked) return resolve();
          const cancel = arm(done);
          function done(): void {
            cancel();
            wake = undefined;
            resolve();
          }
          wake = done;
        });
      const sleep = (ms: number) =>
        waitFor((ring) => {
          const timer = setTimeout(ring, ms);
          return () => clearTimeout(timer);
        });
      /** Until the clock reads `until` (the process's one ticker looks). */
      const alarm = (until: Date) => waitFor((ring) => alarms.set(until, ring));

      // Past this (real time) without a triage, the run is treated as triaged default: the classifier is only an optimization.
      const triageGiveUpAt = Date.now() + 2 * TRIAGE_TIMEOUT_MS;

      let summarized: { readonly seq: number; readonly text: string | undefined } | undefined;

      async function loop(): Promise<void> {
        // Most runs end well within this: they cost a timer, not a read.
        await sleep(Math.min(tickMs, FIRST_LOOK_MS));
        let snapshot: ProgressSnapshot | undefined;
        while (!stopped) {
          const fresh = dirty || snapshot === undefined;
          if (fresh) {
            dirty = false;
            poked = false;
            snapshot = await deps.ledger.load(run.runId).catch((error: unknown) => {
              log.warn({ err: error }, "progress state could not be read; trying again");
              return undefined;
            });
          }
          if (stopped) return;
          if (snapshot === undefined) {
            await sleep(tickMs);
            continue;
          }
          const triage = snapshot.triage ?? (Date.now() >= triageGiveUpAt ? "default" : undefined);
          const state: ProgressState = {
            startedAt: run.startedAt,
            triage,
            ackText: snapshot.ackText,
            lastNoticeAt: snapshot.lastNoticeAt,
            noticesSent: snapshot.lastSeq,
            candidates: snapshot.candidates,
          };
          const now = deps.clock.now();
          const decision = nextNotice(state, now, cadence);
          if (decision.kind === "never") {
            // Trivial: nothing message-shaped for this request. Wait for the claim to end.
            await sleep(60 * 60_000);
            continue;
          }
          if (decision.kind === "wait") {
            // Still waiting for triage (within its bound): look again at the next tick.
            if (triage === undefined) {
              dirty = true;
              await sleep(Math.max(1, Math.min(tickMs, decision.until.getTime() - now.getTime())));
            } else await alarm(decision.until);
            continue;
          }
          // A notice is composed from what the ledger holds now, not from the last look.
          if (!fresh) {
            dirty = true;
            continue;
          }
          if (held > 0) {
            await sleep(tickMs);
            continue;
          }
          const covers = decision.source === "triage_ack" ? [] : snapshot.candidates.map((c) => c.ref);
          const seq = snapshot.lastSeq + 1;
          let text = noticeText(decision.source, state, snapshot.activity, now);
          // A cadence notice with no checkpoint may read better in the fast model's words: once per seq, bounded.
          if (deps.summarizer !== undefined && decision.source === "deadline" && snapshot.candidates.length === 0) {
            if (summarized?.seq !== seq) {
              const facts = activityText(snapshot.activity, now);
              const input = { runId: run.runId, agent: run.agent, requestText: run.requestText, facts, callIndex: seq };
              summarized = { seq, text: await deps.summarizer.summarize(input, stopping.signal).catch(() => undefined) };
            }
            if (summarized.text !== undefined) text = summarized.text;
            // A reply may have started committing meanwhile: look again.
            if (stopped || held > 0) continue;
          }
          deps.noticing?.(run.runId);
          const attempt = deps.ledger.reserve({
            runId: run.runId,
            epoch: run.epoch,
            workerId: run.workerId,
            subject: snapshot.subject,
            seq,
            source: decision.source,
            covers,
            text,
            at: now,
            idempotencyKey: progressKey(snapshot.subject, seq),
            replyToMessageId: run.replyToMessageId,
            addressedActorIds: run.addressedActorIds,
          });
          reserving = attempt.catch(() => false);
          const reserved = await attempt.catch((error: unknown) => {
            log.warn({ err: error }, "progress notice could not be reserved; trying again");
            return undefined;
          });
          if (reserved === false) log.debug({ seq }, "progress notice refused: the run is no longer this claim's, or the sequence was taken");
          if (reserved === true) {
            // What the ledger now holds, without reading it back: the next notice reads it afresh anyway.
            snapshot = { ...snapshot, lastSeq: seq, lastNoticeAt: now, candidates: snapshot.candidates.filter((c) => !covers.includes(c.ref)) };
            continue;
          }
          dirty = true;
          // A refused or failed reservation is looked at again after a tick, not in a tight loop.
          await sleep(tickMs);
        }
      }

      const loopDone = loop().catch((error: unknown) => log.error({ err: error }, "progress supervisor failed; the run goes on without notices"));
      return {
        async hold() {
          held += 1;
          await reserving;
          let released = false;
          return () => {
            if (released) return;
            released = true;
            held -= 1;
          };
        },
        async stop() {
          stopNow();
          run.signal.removeEventListener("abort", stopNow);
          await loopDone;
          if (pokes.get(run.runId) === poke) pokes.delete(run.runId);
        },
      };
    },
  };
}

/**
 * Every supervisor's wait for a cadence deadline, checked by one ticker per process instead of
 * a timer per run: a thousand quiet runs cost one clock read per tick, not a thousand wake-ups.
 * The ticker runs only while someone waits. A manual clock (tests, benches) moves without
 * timers, so deadlines are checked against the clock each tick rather than set as timeouts.
 */
function createAlarms(clock: Clock, tickMs: number): { set(until: Date, ring: () => void): () => void } {
  const waiting = new Map<() => void, number>();
  let ticker: NodeJS.Timeout | undefined;
  const tick = (): void => {
    const now = clock.now().getTime();
    for (const [ring, until] of waiting) if (now >= until) ring();
    if (waiting.size === 0 && ticker !== undefined) {
      clearInterval(ticker);
      ticker = undefined;
    }
  };
  return {
    set(until, ring) {
      waiting.set(ring, until.getTime());
      ticker ??= setInterval(tick, tickMs).unref();
      return () => void waiting.delete(ring);
    },
  };
}
