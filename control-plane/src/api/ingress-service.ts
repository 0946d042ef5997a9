import type { ServiceImpl } from "@connectrpc/connect";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { NotFoundError, PermissionDeniedError, UnimplementedError } from "../domain/errors.js";
import { interruptCounts } from "../domain/interrupt.js";
import { agentViolation, connectorViolation, type Principal, type ScopeViolation } from "../domain/token-scope.js";
import type { ScopeLookups } from "../ledger/token-scope.repository.js";
import { principalOf } from "./auth.js";
import type { RunQueries } from "../ledger/run-query.repository.js";
import type { RunControl } from "../runner/run-control.js";
import { optionalExternalId, requireExternalId, requireSlug, requireText, requireUuid } from "../domain/ids.js";
import type { Mailbox } from "../conversation/ingress.js";
import { runToProto, toEnum } from "./convert.js";
import { RunStatusSchema } from "../../../gen/keel/v1/run_pb.js";
import { requireActor, requireGateDecision, requireReason } from "./validate.js";
import type { GateDecisions } from "../graph/gate-decisions.js";

export interface IngressServiceDeps {
  readonly mailbox: Mailbox;
  readonly control: RunControl;
  readonly runs: RunQueries;
  readonly scopes: ScopeLookups;
  readonly maxMessageTextBytes: number;
  /** Human gates' decisions (DecideGate). */
  readonly gates?: GateDecisions;
}

const deny = (violation: ScopeViolation | undefined): void => {
  if (violation !== undefined) throw new PermissionDeniedError(`${violation.field}: ${violation.reason}`);
};

/** Whether the principal may act for every connector and agent (admins, and connector tokens from before scopes). */
const unlimited = (principal: Principal): boolean =>
  principal.scope.kind === "role" || (principal.scope.kind === "connector" && principal.scope.connectors === "any" && principal.scope.agents === "any");

export function createIngressService(deps: IngressServiceDeps): ServiceImpl<typeof IngressService> {
  /** A call on an existing conversation: it must belong to a connector (and agent) of the token. */
  const checkConversation = async (principal: Principal, agentId: string, conversationId: string): Promise<void> => {
    if (unlimited(principal)) return;
    deny(agentViolation(principal.scope, agentId, "agent_id"));
    const connector = await deps.scopes.conversationConnector(agentId, conversationId);
    if (connector !== undefined) deny(connectorViolation(principal.scope, { connector, agentId }, { connector: "conversation_id", agentId: "agent_id" }));
  };
  /**
   * A call naming a run: the run's connector and agent, read from the ledger, must be in the
   * token's scope; a cancel must also come from an actor the agent's interrupt scope lets in.
   */
  const checkRun = async (principal: Principal, runId: string, cancelBy?: string): Promise<void> => {
    if (principal.scope.kind === "role") return;
    if (unlimited(principal) && cancelBy === undefined) return;
    const facts = await deps.scopes.runFacts(runId);
    if (facts === undefined) throw new NotFoundError("run", runId);
    deny(connectorViolation(principal.scope, { connector: facts.connector, agentId: facts.agentId }, { connector: "run_id", agentId: "run_id" }));
    if (cancelBy !== undefined && facts.interruptScope !== undefined && !interruptCounts(facts.interruptScope, facts.audience, cancelBy)) {
      throw new PermissionDeniedError(`actor.id: under agent ${facts.agentId}'s interrupt scope (${facts.interruptScope}) ${cancelBy} may not cancel this run`);
    }
  };

  return {
    async submitMessage(request, context) {
      const actor = requireActor("actor", request.actor);
      const agentId = requireSlug("agent_id", request.agentId);
      const conversationId = requireExternalId("conversation_id", request.conversationId);
      const connector = request.connector === "" ? "default" : requireSlug("connector", request.connector);
      const principal = principalOf(context);
      deny(connectorViolation(principal.scope, { connector, agentId }));
      await checkConversation(principal, agentId, conversationId);
      const admission = await deps.mailbox.submitMessage(
        {
          agentId,
          conversationId,
          actorId: actor.id,
          actorDisplayName: actor.displayName,
          messageId: requireExternalId("message_id", request.messageId),
          text: requireText("text", request.text, deps.maxMessageTextBytes),
          replyToMessageId: optionalExternalId("reply_to_message_id", request.replyToMessageId),
          connector,
        },
        context.signal,
      );
      return { runId: admission.runId, status: toEnum(RunStatusSchema, admission.status), duplicate: admission.duplicate };
    },
    async editMessage(request, context) {
      const agentId = requireSlug("agent_id", request.agentId);
      const conversationId = requireExternalId("conversation_id", request.conversationId);
      await checkConversation(principalOf(context), agentId, conversationId);
      const admission = await deps.mailbox.editMessage(
        {
          agentId,
          conversationId,
          messageId: requireExternalId("message_id", request.messageId),
          actorId: requireActor("actor", request.actor).id,
          text: requireText("text", request.text, deps.maxMessageTextBytes),
        },
        context.signal,
      );
      return { runId: admission.runId };
    },
    async answerInput(request, context) {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      await checkRun(principalOf(context), runId);
      const status = await deps.control.answer(runId, actor.id, requireText("text", request.text, deps.maxMessageTextBytes));
      return { runId, status: toEnum(RunStatusSchema, status) };
    },
    async decideGate(request, context) {
      const runId = requireUuid("run_id", request.runId);
      const gate = requireExternalId("gate_id", request.gateId);
      const actor = requireActor("actor", request.actor);
      const decision = requireGateDecision("decision", request.decision);
      const reason = requireReason("reason", request.reason).trim();
      await checkRun(principalOf(context), runId);
      if (deps.gates === undefined) throw new UnimplementedError("IngressService.DecideGate is not configured on this server");
      const rootRunId = await deps.gates.decide({ runId, gate, decision, actorId: actor.id, reason: reason === "" ? "no reason given" : reason });
      return { runId: rootRunId };
    },
    async cancelRun(request, context) {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      await checkRun(principalOf(context), runId, actor.id);
      await deps.control.cancel(runId, actor.id, requireReason("reason", request.reason));
      const run = await deps.runs.getRun(runId);
      if (run === undefined) throw new NotFoundError("run", runId);
      return { run: runToProto(run) };
    },
    async continueRun(request, context) {
      const runId = requireUuid("run_id", request.runId);
      const actorId = requireActor("actor", request.actor).id;
      await checkRun(principalOf(context), runId);
      const continuation = await deps.mailbox.continueRun(
        {
          runId,
          actorId,
          // The decision model reads the reply; there is nothing to consent with but words.
          text: requireText("text", request.text, deps.maxMessageTextBytes),
          messageId: optionalExternalId("message_id", request.messageId),
        },
        context.signal,
      );
      return { runId: continuation.runId, authorized: continuation.authorized };
    },
  };
}
