import type { RunStatus } from "../domain/run.js";

/** Actors steering runs from outside the worker: connectors (cancel, answer) and operators. */
export interface RunControl {
  /** Stops the run at its next safe point; a run no worker holds stops at once. */
  cancel(runId: string, actorId: string, reason: string): Promise<RunStatus>;
  /** Answers the run's open keel.ask_user question and queues the run again. */
  answer(runId: string, actorId: string, text: string): Promise<RunStatus>;
  resolveUnknownOutcome(runId: string, invocationId: string, outcome: "applied" | "not_applied", actorId: string, reason: string): Promise<RunStatus>;
  pause(runId: string, actorId: string, reason: string): Promise<RunStatus>;
  resume(runId: string, actorId: string, reason: string): Promise<RunStatus>;
  /** Hands a non-terminal run back to the queue now, fencing out whichever worker held it. */
  requeue(runId: string, actorId: string, reason: string): Promise<RunStatus>;
}
