// When a long run says something in its thread, and what. The reaction acks cover every run; a
// message-shaped notice is only for work long enough that someone would wonder whether the agent
// died. A deadline observes that no reply has landed (it cannot be wrong the way a guess can);
// triage only moves it (long: now; trivial: never) and the agent's checkpoints only bring a
// notice forward. Pure: the supervisor (progress/) feeds it what the ledger holds and a clock.
import type { TriageDuration } from "./triage.js";

export interface ProgressCadence {
  /** Silence before the first notice. */
  readonly firstAfterMs: number;
  /** Silence between later notices. */
  readonly everyMs: number;
  /** The least time between two notices, whatever brought the second one forward. */
  readonly minGapMs: number;
}

export const DEFAULT_PROGRESS_CADENCE: ProgressCadence = { firstAfterMs: 60_000, everyMs: 180_000, minGapMs: 60_000 };

/** The shortest delay a setting may ask for: progress may be made faster for demos, never a flood. */
export const MIN_PROGRESS_DELAY_MS = 10;

/**
 * Cadence settings (the server's, the agent's) applied to the defaults: each may lower a delay,
 * the lowest wins, none can raise one or switch progress off (zero, negative, missing or
 * non-finite keeps the default).
 */
export function progressCadence(...settings: readonly (Partial<ProgressCadence> | undefined)[]): ProgressCadence {
  const lower = (key: keyof ProgressCadence): number => {
    let delay = DEFAULT_PROGRESS_CADENCE[key];
    for (const setting of settings) {
      const asked = setting?.[key];
      if (asked === undefined || !Number.isFinite(asked) || asked <= 0) continue;
      delay = Math.min(delay, Math.max(MIN_PROGRESS_DELAY_MS, Math.floor(asked)));
    }
    return delay;
  };
  return { firstAfterMs: lower("firstAfterMs"), everyMs: lower("everyMs"), minGapMs: lower("minGapMs") };
}

/** The built-in tool an agent reports checkpoints with (tools/report-progress-tool.ts). */
export const REPORT_PROGRESS_TOOL = "keel.report_progress.v1";

export const PROGRESS_KINDS = ["plan", "milestone", "replan", "wait"] as const;
export type ProgressKind = (typeof PROGRESS_KINDS)[number];

/** A checkpoint is one short line, like the triage's ack copy. */
export const MAX_PROGRESS_TEXT_CHARS = 280;

/** Something that may bring a notice forward: the agent's checkpoint, or the run's first workspace. */
export interface ProgressCandidate {
  /** What the ledger calls it: a report_progress invocation id, or "workspace". */
  readonly ref: string;
  readonly kind: ProgressKind | "workspace";
  readonly text: string;
}

/** What the run is doing, as facts the ledger holds. */
export type ProgressActivity =
  | { readonly kind: "tool"; readonly toolName: string; readonly detail: string | undefined; readonly since: Date }
  | { readonly kind: "thinking"; readonly since: Date }
  | { readonly kind: "awaiting_input"; readonly askedOf: readonly string[] }
  | { readonly kind: "unknown" };

export interface ProgressState {
  /** When the silence began: the run's start. */
  readonly startedAt: Date;
  /** undefined while triage is still out: notices that only triage could allow wait for it, or for the deadline. */
  readonly triage: TriageDuration | undefined;
  readonly ackText: string | undefined;
  /** The subject's last notice, and how many it has had. */
  readonly lastNoticeAt: Date | undefined;
  readonly noticesSent: number;
  /** Candidates no notice has covered yet, oldest first. */
  readonly candidates: readonly ProgressCandidate[];
}

export type ProgressSource = "triage_ack" | "deadline" | "checkpoint" | "workspace";

export type ProgressDecision =
  | { readonly kind: "send"; readonly source: ProgressSource }
  | { readonly kind: "wait"; readonly until: Date }
  /** Triage said trivial: nothing message-shaped, ever. */
  | { readonly kind: "never" };

const at = (ms: number) => new Date(ms);

/** When the next notice is due and why, or that there is none for this subject. */
export function nextNotice(state: ProgressState, now: Date, cadence: ProgressCadence): ProgressDecision {
  if (state.triage === "trivial") return { kind: "never" };
  const last = state.lastNoticeAt?.getTime();
  // A long request says something at once, once: its stashed copy costs no model latency now.
  // Never sooner than the first deadline of this attempt: a continuation or successor that shares
  // an older cadence does not speak the moment it starts.
  const start = state.startedAt.getTime();
  const deadlineAt =
    last === undefined ? start + (state.triage === "long" ? 0 : cadence.firstAfterMs) : Math.max(last + cadence.everyMs, start + cadence.firstAfterMs);
  let dueAt = deadlineAt;
  let source: ProgressSource = last === undefined && state.triage === "long" ? "triage_ack" : "deadline";
  // A checkpoint waits for triage (a trivial request says nothing) and keeps the gap to the last notice.
  const candidate = state.candidates.at(-1);
  if (candidate !== undefined && state.triage !== undefined) {
    const candidateAt = last === undefined ? now.getTime() : Math.max(now.getTime(), last + cadence.minGapMs);
    if (candidateAt < dueAt) {
      dueAt = candidateAt;
      source = candidate.kind === "workspace" && state.candidates.every((c) => c.kind === "workspace") ? "workspace" : "checkpoint";
    }
  }
  return now.getTime() >= dueAt ? { kind: "send", source } : { kind: "wait", until: at(dueAt) };
}

/** "2 min 10 s", "45 s", "1 h 3 min": how long, at the grain a person reads. */
export function formatDuration(ms: number): string {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return seconds % 60 === 0 ? `${minutes} min` : `${minutes} min ${seconds % 60} s`;
  return minutes % 60 === 0 ? `${Math.floor(minutes / 60)} h` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

const MAX_DETAIL_CHARS = 80;

function clip(text: string, max: number): string {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length <= max ? line : `${line.slice(0, max - 1)}…`;
}

/** Honest facts from the ledger: what is running and for how long, or who is being waited for. */
export function activityText(activity: ProgressActivity, now: Date): string {
  switch (activity.kind) {
    case "tool": {
      const detail = activity.detail === undefined || activity.detail.trim() === "" ? "" : ` \`${clip(activity.detail, MAX_DETAIL_CHARS)}\``;
      const ms = now.getTime() - activity.since.getTime();
      // Under a second is "just started": "for 0 s" would read like a bug.
      return `running ${activity.toolName}${detail}${ms < 1000 ? "" : ` for ${formatDuration(ms)}`}`;
    }
    case "thinking":
      return `thinking (for ${formatDuration(now.getTime() - activity.since.getTime())})`;
    case "awaiting_input":
      return activity.askedOf.length === 0 ? "waiting for an answer" : `waiting for an answer from ${activity.askedOf.join(", ")}`;
    case "unknown":
      return "still working";
  }
}

const KIND_LABEL: Record<ProgressCandidate["kind"], string> = {
  plan: "Plan",
  milestone: "Done so far",
  replan: "Change of plan",
  wait: "Waiting",
  workspace: "Working in a sandbox workspace",
};

/**
 * The copy of a notice. The triage's stashed sentence for a long request's first notice; else the
 * newest candidate (candidates arriving together make one notice), with the activity beside it;
 * else the facts alone. Bounded like a checkpoint.
 */
export function noticeText(source: ProgressSource, state: ProgressState, activity: ProgressActivity, now: Date): string {
  const facts = activityText(activity, now);
  if (source === "triage_ack" && state.ackText !== undefined && state.ackText.trim() !== "") return clip(state.ackText, MAX_PROGRESS_TEXT_CHARS);
  const checkpoints = state.candidates.filter((c) => c.kind !== "workspace");
  const newest = checkpoints.at(-1) ?? state.candidates.at(-1);
  if (newest === undefined || source === "triage_ack") return clip(`Still on it: ${facts}.`, MAX_PROGRESS_TEXT_CHARS);
  const text = newest.kind === "workspace" ? facts : newest.text;
  return clip(`${KIND_LABEL[newest.kind]}: ${text}${newest.kind === "workspace" ? "" : ` (${facts})`}`, MAX_PROGRESS_TEXT_CHARS);
}

/** One notice per (subject, sequence): a retried or taken-over supervisor reserves the same key. */
export function progressKey(subject: string, seq: number): string {
  return `progress:${subject}:${seq}`;
}
