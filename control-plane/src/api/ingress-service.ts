import type { ServiceImpl } from "@connectrpc/connect";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { NotFoundError, UnimplementedError } from "../domain/errors.js";
import type { RunQueries } from "../ledger/run-query.repository.js";
import type { RunControl } from "../runner/run-control.js";
import { optionalExternalId, requireExternalId, requireSlug, requireText, requireUuid } from "../domain/ids.js";
import type { Mailbox } from "../conversation/ingress.js";
import { runToProto, toEnum } from "./convert.js";
import { RunStatusSchema } from "../../../gen/keel/v1/run_pb.js";
import { requireActor, requireEnum, requireReason } from "./validate.js";

export interface IngressServiceDeps {
  readonly mailbox: Mailbox;
  readonly control: RunControl;
  readonly runs: RunQueries;
  readonly maxMessageTextBytes: number;
}

const later = (rpc: string): never => {
  throw new UnimplementedError(`IngressService.${rpc} is not implemented yet; it arrives with the WorkGraph work`);
};

export function createIngressService(deps: IngressServiceDeps): ServiceImpl<typeof IngressService> {
  return {
    async submitMessage(request, context) {
      const actor = requireActor("actor", request.actor);
      const admission = await deps.mailbox.submitMessage(
        {
          agentId: requireSlug("agent_id", request.agentId),
          conversationId: requireExternalId("conversation_id", request.conversationId),
          actorId: actor.id,
          actorDisplayName: actor.displayName,
          messageId: requireExternalId("message_id", request.messageId),
          text: requireText("text", request.text, deps.maxMessageTextBytes),
          replyToMessageId: optionalExternalId("reply_to_message_id", request.replyToMessageId),
          connector: request.connector === "" ? "default" : requireSlug("connector", request.connector),
        },
        context.signal,
      );
      return { runId: admission.runId, status: toEnum(RunStatusSchema, admission.status), duplicate: admission.duplicate };
    },
    async editMessage(request, context) {
      const admission = await deps.mailbox.editMessage(
        {
          agentId: requireSlug("agent_id", request.agentId),
          conversationId: requireExternalId("conversation_id", request.conversationId),
          messageId: requireExternalId("message_id", request.messageId),
          actorId: requireActor("actor", request.actor).id,
          text: requireText("text", request.text, deps.maxMessageTextBytes),
        },
        context.signal,
      );
      return { runId: admission.runId };
    },
    async answerInput(request) {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      const status = await deps.control.answer(runId, actor.id, requireText("text", request.text, deps.maxMessageTextBytes));
      return { runId, status: toEnum(RunStatusSchema, status) };
    },
    decideGate(request) {
      requireUuid("run_id", request.runId);
      requireExternalId("gate_id", request.gateId);
      requireActor("actor", request.actor);
      requireEnum("decision", request.decision);
      requireReason("reason", request.reason);
      return later("DecideGate");
    },
    async cancelRun(request) {
      const runId = requireUuid("run_id", request.runId);
      const actor = requireActor("actor", request.actor);
      await deps.control.cancel(runId, actor.id, requireReason("reason", request.reason));
      const run = await deps.runs.getRun(runId);
      if (run === undefined) throw new NotFoundError("run", runId);
      return { run: runToProto(run) };
    },
    async continueRun(request, context) {
      const continuation = await deps.mailbox.continueRun(
        {
          runId: requireUuid("run_id", request.runId),
          actorId: requireActor("actor", request.actor).id,
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
