// How the runner joins a run's supervisor to its claim: what the supervisor is told about the
// claim, and a store whose commits that answer the conversation (a reply, a question, a run's
// end) hold notices back until they are committed.
import { isTerminal } from "../domain/run.js";
import type { ClaimedRun, RunStore, Settlement } from "../runner/run-store.js";
import type { RunProgress, SupervisedRun } from "./progress-supervisor.js";

export function supervisedRun(claimed: ClaimedRun, context: { readonly workerId: string; readonly signal: AbortSignal }): SupervisedRun {
  return {
    runId: claimed.runId,
    epoch: claimed.epoch,
    workerId: context.workerId,
    startedAt: claimed.startedAt,
    replyToMessageId: claimed.replyToMessageId,
    addressedActorIds: [...new Set(claimed.messages.map((m) => m.actorId))],
    agent: claimed.agent,
    requestText: claimed.messages.map((m) => m.text).join("\n"),
    cadence: claimed.agent.progress,
    signal: context.signal,
  };
}

const answers = (commit: Settlement): boolean => isTerminal(commit.status) || commit.emissions.some((e) => e.kind === "reply" || e.kind === "question");

/**
 * The store with its answering commits held against the supervisor: a notice in flight is
 * committed first, none starts until the commit is done, and after it the fence refuses any
 * for a settled run. So no notice follows the reply in the connector's stream.
 */
export function holdingNotices(store: RunStore, progress: RunProgress): RunStore {
  const held = async <T>(commit: Settlement, write: () => Promise<T>): Promise<T> => {
    if (!answers(commit)) return write();
    const release = await progress.hold();
    try {
      return await write();
    } finally {
      release();
    }
  };
  return new Proxy(store, {
    get(target, key, receiver) {
      const value: unknown = Reflect.get(target, key, receiver);
      if (key === "commitStep") return (commit: Parameters<RunStore["commitStep"]>[0]) => held(commit, () => target.commitStep(commit));
      if (key === "commitToolOutcome") return (commit: Parameters<RunStore["commitToolOutcome"]>[0]) => held(commit, () => target.commitToolOutcome(commit));
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}
