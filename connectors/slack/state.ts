// The Slack connector's durable state, one JSON file: the Subscribe cursor, the emission being sent
// (written before the Slack call, so a crash after sending is reported AMBIGUOUS, never re-sent),
// the reaction each message shows, the threads the bot is in and the questions awaiting an answer.
import { readFileSync, renameSync, writeFileSync } from "node:fs";

export type Settlement = { readonly status: "delivered" | "failed" | "ambiguous"; readonly remoteRef: string; readonly detail: string };

export interface InFlight {
  readonly emissionId: string;
  readonly seq: number;
  /** Reactions are idempotent in Slack: one interrupted mid-call is simply made again. */
  readonly repeatable: boolean;
  /** The outcome, once known, so a failed AcknowledgeEmission is retried with it rather than guessed. */
  readonly outcome?: Settlement;
}

export interface OpenQuestion {
  readonly runId: string;
  /** Who may answer; empty means anyone in the thread. */
  readonly actors: readonly string[];
}

export interface SlackState {
  readonly afterSeq: number;
  readonly inFlight: InFlight | null;
  /** `channel:ts` → the ack reaction the message shows now. */
  readonly reactions: Readonly<Record<string, string>>;
  /** Conversation ids (`channel:thread_ts`) the bot was mentioned or posted in, oldest first. */
  readonly threads: readonly string[];
  /** Conversation id → the question asked there last. */
  readonly questions: Readonly<Record<string, OpenQuestion>>;
}

/** Bounds on what the file remembers: old threads and reactions fall off first. */
const MAX_THREADS = 2_000;
const MAX_REACTIONS = 2_000;

export const EMPTY_STATE: SlackState = { afterSeq: 0, inFlight: null, reactions: {}, threads: [], questions: {} };

export function loadState(file: string): SlackState {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return EMPTY_STATE;
    throw error;
  }
  const parsed = JSON.parse(text) as Partial<SlackState>;
  return {
    afterSeq: typeof parsed.afterSeq === "number" && parsed.afterSeq >= 0 ? parsed.afterSeq : 0,
    inFlight: parsed.inFlight ?? null,
    reactions: parsed.reactions ?? {},
    threads: parsed.threads ?? [],
    questions: parsed.questions ?? {},
  };
}

/** Written to a temporary file and renamed over the old one, so a crash leaves one or the other. */
export function saveState(file: string, state: SlackState): void {
  const temporary = `${file}.tmp`;
  writeFileSync(temporary, JSON.stringify(state));
  renameSync(temporary, file);
}

/** The state in memory and on disk, changed only through `update` so every change is written. */
export class StateStore {
  #state: SlackState;
  constructor(private readonly file: string) {
    this.#state = loadState(file);
  }

  get current(): SlackState {
    return this.#state;
  }

  update(change: (state: SlackState) => Partial<SlackState>): void {
    this.#state = { ...this.#state, ...change(this.#state) };
    saveState(this.file, this.#state);
  }

  knowsThread(conversationId: string): boolean {
    return this.#state.threads.includes(conversationId);
  }

  addThread(conversationId: string): void {
    if (this.knowsThread(conversationId)) return;
    this.update((state) => ({ threads: [...state.threads, conversationId].slice(-MAX_THREADS) }));
  }

  setReaction(messageKey: string, name: string): void {
    this.update((state) => {
      const { [messageKey]: _previous, ...rest } = state.reactions;
      const entries = Object.entries({ ...rest, [messageKey]: name });
      return { reactions: Object.fromEntries(entries.slice(-MAX_REACTIONS)) };
    });
  }

  setQuestion(conversationId: string, question: OpenQuestion | undefined): void {
    this.update((state) => {
      const { [conversationId]: _previous, ...rest } = state.questions;
      return { questions: question === undefined ? rest : { ...rest, [conversationId]: question } };
    });
  }

  /** Drops every question of a run that has settled. */
  clearQuestionsOf(runId: string): void {
    if (!Object.values(this.#state.questions).some((question) => question.runId === runId)) return;
    this.update((state) => ({ questions: Object.fromEntries(Object.entries(state.questions).filter(([, question]) => question.runId !== runId)) }));
  }
}
