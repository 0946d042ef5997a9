// Human gates (issue #14): a person's decision lets a WorkGraph go on past a gate or fails it.
// Connectors decide through IngressService.DecideGate, operators through RunService.DecideGate;
// both come here. The decision is committed first (durably: the decider is told it is recorded),
// then a scheduler pass moves the graph on; the sweep redoes a pass a crash in between lost.
import { FailedPreconditionError, NotFoundError } from "../domain/errors.js";
import type { GateDecisionCommand, WorkGraphLedger } from "./work-graph-ledger.js";
import type { WorkGraphScheduler } from "./work-graph-scheduler.js";

export interface GateDecisions {
  /** Records the decision and returns the graph's root run id; refusals are domain errors. */
  decide(command: GateDecisionCommand): Promise<string>;
}

export function createGateDecisions(ledger: Pick<WorkGraphLedger, "decideGate">, scheduler: Pick<WorkGraphScheduler, "poke">): GateDecisions {
  return {
    async decide(command) {
      const outcome = await ledger.decideGate(command);
      switch (outcome.kind) {
        case "not_found":
          throw new NotFoundError(`gate in the work graph of run ${command.runId}:`, command.gate);
        case "refused":
          throw new FailedPreconditionError(outcome.reason);
        case "recorded":
          scheduler.poke(outcome.rootRunId);
          return outcome.rootRunId;
        case "already":
          return outcome.rootRunId;
      }
    },
  };
}
