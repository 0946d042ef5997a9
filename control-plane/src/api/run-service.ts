import type { ServiceImpl } from "@connectrpc/connect";
import { RunService, RunStepView } from "../../../gen/keel/v1/run_service_pb.js";
import { ResolvedOutcomeSchema, RunStatusSchema } from "../../../gen/keel/v1/run_pb.js";
import { InvalidArgumentError, NotFoundError, UnimplementedError } from "../domain/errors.js";
import type { RunControl } from "../runner/run-control.js";
import { optionalExternalId, requireExternalId, requireSlug, requireUuid } from "../domain/ids.js";
import type { RunRecord } from "../domain/records.js";
import { isTerminal, type RunStatus } from "../domain/run.js";
import { DEFAULT_STEPS_PAGE_BYTES, parseRunsPageToken, parseStepsPageToken, type RunQueries } from "../ledger/run-query.repository.js";
import { armNotification, type NotificationHub } from "../ledger/notification-hub.js";
import type { RunForks } from "../ledger/run-fork.repository.js";
import type { WorkGraphReads } from "../ledger/work-graph-view.repository.js";
import type { GateDecisions } from "../graph/gate-decisions.js";
import type { SandboxHostReads } from "../ledger/sandbox-host-view.repository.js";
import { encodeHostsPageToken, MAX_HOSTS_PAGE, parseHostsPageToken, sandboxHostToProto } from "./sandbox-host-convert.js";
import { artifactToProto, fromEnum, runEventToProto, runStepToProto, runToProto, toolInvocationToProto } from "./convert.js";
import { cursorOf, pageSizeOf, requireActor, requireEnum, requireGateDecision, requireReason } from "./validate.js";
import { workGraphToProto } from "./work-graph-convert.js";

export interface RunServiceDeps {
  readonly runs: RunQueries;
  readonly control: RunControl;
  readonly hub: NotificationHub;
  readonly pollMs: number;
  /** Operator forks; absent, ForkRun answers Unimplemented. */
  readonly forks?: RunForks;
  /** The server's limit on one message: a ListRunSteps page reads at most half of it in records. */
  readonly maxReplyBytes?: number;
  /** WorkGraphs; absent, GetWorkGraph answers NotFound. */
  readonly graphs?: WorkGraphReads;
  /** The fleet's hosts (RunService.ListSandboxHosts). */
  readonly hosts?: SandboxHostReads;
  /** Human gates' decisions (RunService.DecideGate). */
  readonly gates?: GateDecisions;
}

/** A ListRuns token the ledger did not issue is the caller's mistake (the ledger defines the format). */
function requireRunsPageToken(token: string): string {
  if (token !== "" && parseRunsPageToken(token) === undefined) {
    throw new InvalidArgumentError("page_token", "is not a page token from ListRuns");
  }
  return token;
}

/** Unset is FULL; a number RunStepView does not name is refused. */
function stepViewOf(view: RunStepView): RunStepView.FULL | RunStepView.SUMMARY {
  if (view === RunStepView.UNSPECIFIED || view === RunStepView.FULL) return RunStepView.FULL;
  if (view === RunStepView.SUMMARY) return view;
  throw new InvalidArgumentError("view", `is not a RunStepView (${String(view)})`);
}

/** ListRunSteps tokens, the same: a garbage token is refused, never read as "from the start". */
function requireStepsPageToken(token: string): string {
  if (token !== "" && parseStepsPageToken(token) === undefined) {
    throw new InvalidArgumentError("page_token", "is not a page token from ListRunSteps");
  }
  return token;
}

/** Actions that stop or branch a run must say why: the reason is what the ledger keeps of the operator's intent. */
function requireGivenReason(reason: string): string {
  if (reason.trim() === "") throw new InvalidArgumentError("reason", "is required");
  return reason;
}

export function createRunService(deps: RunServiceDeps): ServiceImpl<typeof RunService> {
  // Records a reply may carry: half the message limit leaves room for encoding and the rest.
  const replyBudget = deps.maxReplyBytes === undefined ? DEFAULT_STEPS_PAGE_BYTES : Math.floor(deps.maxReplyBytes / 2);
  const mustGetRun = async (runId: string): Promise<RunRecord> => {
    const run = await deps.runs.getRun(runId);
    if (run === undefined) throw new NotFoundError("run", runId);
    return run;
  };
  const operatorAction =
    (act: (runId: string, actorId: string, reason: string) => Promise<unknown>) =>
    async (request: { runId: string; actor?: { id: string; displayName: string } | undefined; reason: string }) => {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      await act(runId, actor.id, requireReason("reason", request.reason));
      return { run: runToProto(await mustGetRun(runId)) };
    };

  return {
    async getRun(request) {
      return { run: runToProto(await mustGetRun(requireUuid("run_id", request.runId))) };
    },
    async listRuns(request) {
      const agentId = request.agentId === "" ? undefined : requireSlug("agent_id", request.agentId);
      const conversationId = optionalExternalId("conversation_id", request.conversationId);
      const status = fromEnum<RunStatus>(RunStatusSchema, request.status);
      const page = await deps.runs.listRuns(
        {
          ...(agentId === undefined ? {} : { agentId }),
          ...(conversationId === undefined ? {} : { conversationId }),
          ...(status === undefined ? {} : { status }),
        },
        pageSizeOf(request.pageSize),
        requireRunsPageToken(request.pageToken),
      );
      return { runs: page.items.map(runToProto), nextPageToken: page.nextPageToken };
    },
    async listRunSteps(request) {
      const runId = requireUuid("run_id", request.runId);
      const pageToken = requireStepsPageToken(request.pageToken);
      const view = stepViewOf(request.view);
      await mustGetRun(runId);
      const page =
        view === RunStepView.SUMMARY
          ? await deps.runs.listStepSummaries(runId, pageSizeOf(request.pageSize), pageToken)
          : await deps.runs.listSteps(runId, pageSizeOf(request.pageSize), pageToken, replyBudget);
      return { steps: page.items.map(runStepToProto), nextPageToken: page.nextPageToken };
    },
    async getRunStep(request) {
      const runId = requireUuid("run_id", request.runId);
      const stepId = requireUuid("step_id", request.stepId);
      // Whole, it is refused before loading only when its records alone exceed the message limit (the reply would fail anyway).
      const step =
        stepViewOf(request.view) === RunStepView.SUMMARY
          ? await deps.runs.getStepSummary(runId, stepId)
          : await deps.runs.getStep(runId, stepId, deps.maxReplyBytes ?? DEFAULT_STEPS_PAGE_BYTES * 4);
      if (step === undefined) throw new NotFoundError("step", stepId);
      return { step: runStepToProto(step) };
    },
    async listArtifacts(request) {
      const runId = requireUuid("run_id", request.runId);
      await mustGetRun(runId);
      return { artifacts: (await deps.runs.listArtifacts(runId)).map(artifactToProto) };
    },
    async *watchRun(request, context) {
      const runId = requireUuid("run_id", request.runId);
      await mustGetRun(runId);
      let cursor = cursorOf("after_seq", request.afterSeq, 2 ** 31 - 1); // run_events.seq is an int
      while (!context.signal.aborted) {
        const wake = armNotification(deps.hub, "keel_run_events", (payload) => payload === runId);
        const events = await deps.runs.eventsAfter(runId, cursor, 200);
        for (const event of events) {
          yield { event: runEventToProto(event) };
          cursor = event.seq;
        }
        if (events.length === 200) {
          wake.cancel();
          continue;
        }
        // Events are written in the same transaction as the status, so a settled run has nothing left to say.
        const run = await mustGetRun(runId);
        if (isTerminal(run.status) && (await deps.runs.eventsAfter(runId, cursor, 1)).length === 0) {
          wake.cancel();
          return;
        }
        await wake.wait(deps.pollMs, context.signal);
      }
    },
    async getWorkGraph(request) {
      const runId = requireUuid("run_id", request.runId);
      const run = await mustGetRun(runId);
      const graph = await deps.graphs?.graphOf(runId);
      if (graph === undefined) throw new NotFoundError("work graph of run", `${run.id} (execution shape ${run.shape})`);
      return { graph: workGraphToProto(graph) };
    },
    async resolveUnknownOutcome(request) {
      const runId = requireUuid("run_id", request.runId);
      const invocationId = requireUuid("tool_invocation_id", request.toolInvocationId);
      const outcome = fromEnum<"applied" | "not_applied">(ResolvedOutcomeSchema, requireEnum("outcome", request.outcome));
      const actor = requireActor("actor", request.actor);
      const reason = requireReason("reason", request.reason);
      if (outcome === undefined) throw new InvalidArgumentError("outcome", "must be APPLIED or NOT_APPLIED");
      await deps.control.resolveUnknownOutcome(runId, invocationId, outcome, actor.id, reason);
      const invocation = await deps.runs.getToolInvocation(runId, invocationId);
      if (invocation === undefined) throw new NotFoundError("tool invocation", invocationId);
      return { toolInvocation: toolInvocationToProto(invocation), run: runToProto(await mustGetRun(runId)) };
    },
    pauseRun: operatorAction((runId, actorId, reason) => deps.control.pause(runId, actorId, reason)),
    resumeRun: operatorAction((runId, actorId, reason) => deps.control.resume(runId, actorId, reason)),
    requeueRun: operatorAction((runId, actorId, reason) => deps.control.requeue(runId, actorId, reason)),
    // The connector cancel's path: stops at the next safe point, recorded with the operator and reason.
    cancelRun: operatorAction((runId, actorId, reason) => deps.control.cancel(runId, actorId, requireGivenReason(reason))),
    async decideGate(request) {
      const runId = requireUuid("run_id", request.runId);
      const gate = requireExternalId("gate_id", request.gateId);
      const actor = requireActor("actor", request.actor);
      const decision = requireGateDecision("decision", request.decision);
      const reason = requireGivenReason(requireReason("reason", request.reason));
      if (deps.gates === undefined || deps.graphs === undefined) throw new UnimplementedError("RunService.DecideGate is not configured on this server");
      const rootRunId = await deps.gates.decide({ runId, gate, decision, actorId: actor.id, reason });
      const graph = await deps.graphs.graphOf(rootRunId);
      if (graph === undefined) throw new NotFoundError("work graph of run", rootRunId);
      return { graph: workGraphToProto(graph) };
    },
    async listSandboxHosts(request) {
      if (deps.hosts === undefined) throw new UnimplementedError("RunService.ListSandboxHosts is not configured on this server");
      const size = Math.min(request.pageSize === 0 ? 100 : request.pageSize, MAX_HOSTS_PAGE);
      const after = request.pageToken === "" ? undefined : parseHostsPageToken(request.pageToken);
      const hosts = await deps.hosts.listHosts(size + 1, after);
      const page = hosts.slice(0, size);
      const last = page.at(-1);
      return { hosts: page.map(sandboxHostToProto), nextPageToken: hosts.length > size && last !== undefined ? encodeHostsPageToken(last.hostId) : "" };
    },
    async forkRun(request) {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      const reason = requireGivenReason(requireReason("reason", request.reason));
      if (deps.forks === undefined) throw new UnimplementedError("RunService.ForkRun is not configured on this server");
      const forkId = await deps.forks.fork({ sourceRunId: runId, stepIndex: request.stepIndex, actorId: actor.id, reason });
      return { run: runToProto(await mustGetRun(forkId)) };
    },
  };
}
