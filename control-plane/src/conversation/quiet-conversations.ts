// What this process last knew of each conversation it admitted to: quiet (no root run live) or
// not, as of its own admission's read and the ends of the runs its workers drove since. Admission
// uses it to start a new request's first model call before it reads the conversation
// (admission.ts); the read under the conversation's row lock still decides, and a guess the read
// disproves is withdrawn before anything is written or sent. A hint, never the truth: a run
// another process admitted or ended is seen at this process's next read of the conversation.
import type { AgentSpec } from "../domain/agent.js";
import type { RunStatus } from "../domain/run.js";
import type { TranscriptProgress } from "../domain/transcript-builder.js";

/** A conversation as the read that last saw it quiet left it: what a fresh run's first call is built from. */
export interface QuietView {
  /** The ledger's id of the conversation. */
  readonly conversationId: string;
  readonly agent: AgentSpec;
  readonly earlierProgress: readonly TranscriptProgress[];
}

interface Entry extends QuietView {
  /** Root runs of the conversation live as far as this process knows; quiet when empty. */
  readonly live: Set<string>;
  /** Message ids this process admitted here lately: a connector's redelivery is not guessed at. */
  readonly recentMessageIds: string[];
}

const RECENT_MESSAGE_IDS = 8;
/** Conversations remembered; the least recently admitted are forgotten first. */
export const DEFAULT_QUIET_CAPACITY = 4_096;

/** Guesses made since the process started, and how many of them a read disproved. */
export interface SpeculativeStarts {
  readonly started: number;
  readonly withdrawn: number;
}

export class QuietConversations {
  private readonly entries = new Map<string, Entry>();
  private readonly keyOfRun = new Map<string, string>();
  private started = 0;
  private withdrawn = 0;

  constructor(private readonly capacity = DEFAULT_QUIET_CAPACITY) {}

  /** The view to guess from, when the conversation was quiet when last seen and the message is new here. */
  quiet(agentId: string, externalConversationId: string, messageId: string): QuietView | undefined {
    const entry = this.entries.get(keyOf(agentId, externalConversationId));
    if (entry === undefined || entry.live.size > 0 || entry.recentMessageIds.includes(messageId)) return undefined;
    return entry;
  }

  /**
   * A guess is being made for `runId`: the conversation counts as busy with it, so a second
   * message arriving before the admission commits is not guessed at too.
   */
  guessing(agentId: string, externalConversationId: string, runId: string): void {
    this.started += 1;
    const key = keyOf(agentId, externalConversationId);
    const entry = this.entries.get(key);
    if (entry === undefined) return;
    entry.live.add(runId);
    this.keyOfRun.set(runId, key);
  }

  /** An admission committed: `live` are the conversation's root runs live after it, by its read and its writes. */
  admitted(agentId: string, externalConversationId: string, view: QuietView, live: readonly string[], messageId: string): void {
    const key = keyOf(agentId, externalConversationId);
    const before = this.entries.get(key);
    if (before !== undefined) {
      this.drop(key, before);
      this.entries.delete(key);
    }
    const agent = before !== undefined && sameJson(before.agent, view.agent) ? before.agent : view.agent;
    const recentMessageIds = [...(before?.recentMessageIds ?? []), messageId].slice(-RECENT_MESSAGE_IDS);
    const entry: Entry = { conversationId: view.conversationId, agent, earlierProgress: view.earlierProgress, live: new Set(live), recentMessageIds };
    this.entries.set(key, entry);
    for (const runId of live) this.keyOfRun.set(runId, key);
    if (this.entries.size > this.capacity) {
      const [oldestKey, oldest] = this.entries.entries().next().value as [string, Entry];
      this.drop(oldestKey, oldest);
      this.entries.delete(oldestKey);
    }
  }

  /**
   * A run this process drove ended with `status`. After an exhausted budget the next message may
   * be a continuation's consent, so the conversation is forgotten rather than called quiet.
   */
  runEnded(runId: string, status: RunStatus): void {
    const key = this.keyOfRun.get(runId);
    if (key === undefined) return;
    this.keyOfRun.delete(runId);
    const entry = this.entries.get(key);
    if (entry === undefined) return;
    entry.live.delete(runId);
    if (status === "budget_exhausted") this.forget(key);
  }

  /** A notice is being written for a run: its conversation's latest notices, part of the view, are no longer known. */
  noticed(runId: string): void {
    const key = this.keyOfRun.get(runId);
    if (key !== undefined) this.forget(key);
  }

  /** The conversation was not as remembered, or its admission failed: nothing is guessed until it is read again. */
  forgetConversation(agentId: string, externalConversationId: string): void {
    this.forget(keyOf(agentId, externalConversationId));
  }

  /** A guess was withdrawn: the read disproved it, or the admission failed or was a duplicate. */
  guessWithdrawn(): void {
    this.withdrawn += 1;
  }

  get starts(): SpeculativeStarts {
    return { started: this.started, withdrawn: this.withdrawn };
  }

  /** The counters for /metrics: a withdrawn guess cost an aborted model call. */
  render(): string {
    return [
      "# HELP keel_speculative_starts_total New requests whose first model call started before admission read their conversation.",
      "# TYPE keel_speculative_starts_total counter",
      `keel_speculative_starts_total ${this.started}`,
      "# HELP keel_speculative_starts_withdrawn_total Speculative starts withdrawn, their model call aborted: the read disproved the guess, or the admission failed.",
      "# TYPE keel_speculative_starts_withdrawn_total counter",
      `keel_speculative_starts_withdrawn_total ${this.withdrawn}`,
      "",
    ].join("\n");
  }

  /** Whether a guess from `view` holds for what the admission read. */
  static holds(view: QuietView, read: QuietView): boolean {
    return view.conversationId === read.conversationId && sameJson(view.earlierProgress, read.earlierProgress) && sameJson(view.agent, read.agent);
  }

  get size(): number {
    return this.entries.size;
  }

  private forget(key: string): void {
    const entry = this.entries.get(key);
    if (entry === undefined) return;
    this.drop(key, entry);
    this.entries.delete(key);
  }

  private drop(key: string, entry: Entry): void {
    for (const runId of entry.live) if (this.keyOfRun.get(runId) === key) this.keyOfRun.delete(runId);
  }
}

const keyOf = (agentId: string, externalConversationId: string): string => `${agentId}\u0000${externalConversationId}`;

/** Each spec object printed once: an admission compares the one it read with the one remembered. */
const printed = new WeakMap<object, string>();
function jsonOf(value: unknown): string {
  if (typeof value !== "object" || value === null) return JSON.stringify(value);
  let json = printed.get(value);
  if (json === undefined) {
    json = JSON.stringify(value);
    printed.set(value, json);
  }
  return json;
}

// Both sides come from the ledger's JSON (jsonb keeps one key order), so equal values print alike.
const sameJson = (a: unknown, b: unknown): boolean => a === b || jsonOf(a) === jsonOf(b);
