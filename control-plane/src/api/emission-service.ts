import type { ServiceImpl } from "@connectrpc/connect";
import { DeliveryStatus, EmissionService } from "../../../gen/keel/v1/emission_service_pb.js";
import { InvalidArgumentError, NotFoundError, PermissionDeniedError } from "../domain/errors.js";
import { agentViolation, connectorViolation, type ScopeViolation } from "../domain/token-scope.js";
import { requireSlug, requireUuid } from "../domain/ids.js";
import type { EmissionQueries } from "../ledger/emission.repository.js";
import { armNotification, type NotificationHub } from "../ledger/notification-hub.js";
import { principalOf } from "./auth.js";
import { emissionToProto } from "./convert.js";

export interface EmissionServiceDeps {
  readonly emissions: EmissionQueries;
  readonly hub: NotificationHub;
  /** Safety-net re-read interval for a quiet stream; NOTIFY normally wakes it first. */
  readonly pollMs: number;
}

const BATCH = 200;
const OUTCOMES: Partial<Record<DeliveryStatus, "delivered" | "failed" | "ambiguous">> = {
  [DeliveryStatus.DELIVERED]: "delivered",
  [DeliveryStatus.FAILED]: "failed",
  [DeliveryStatus.AMBIGUOUS]: "ambiguous",
};

const deny = (violation: ScopeViolation | undefined): void => {
  if (violation !== undefined) throw new PermissionDeniedError(`${violation.field}: ${violation.reason}`);
};

export function createEmissionService(deps: EmissionServiceDeps): ServiceImpl<typeof EmissionService> {
  return {
    async *subscribe(request, context) {
      const connector = requireSlug("connector", request.connector);
      const { scope } = principalOf(context);
      deny(connectorViolation(scope, { connector }));
      // A token limited to some agents sees only their emissions; the cursor still moves past the rest.
      const visible = (agentId: string) => agentViolation(scope, agentId, "agent_id") === undefined;
      let cursor = Number(request.afterSeq);
      while (!context.signal.aborted) {
        const wake = armNotification(deps.hub, "keel_emissions", (payload) => payload === connector);
        const batch = await deps.emissions.listAfter(connector, cursor, BATCH);
        for (const emission of batch) {
          if (visible(emission.agentId)) yield { emission: emissionToProto(emission) };
          cursor = emission.seq;
        }
        if (batch.length === BATCH) wake.cancel();
        else await wake.wait(deps.pollMs, context.signal);
      }
    },
    async acknowledgeEmission(request, context) {
      const emissionId = requireUuid("emission_id", request.emissionId);
      const outcome = OUTCOMES[request.outcome];
      if (outcome === undefined) throw new InvalidArgumentError("outcome", "must be DELIVERED, FAILED or AMBIGUOUS");
      if (request.remoteRef.length > 1024) throw new InvalidArgumentError("remote_ref", "must be at most 1024 characters");
      if (request.detail.length > 4096) throw new InvalidArgumentError("detail", "must be at most 4096 characters");
      const { scope } = principalOf(context);
      if (scope.kind !== "role") {
        const target = await deps.emissions.get(emissionId);
        if (target === undefined) throw new NotFoundError("emission", emissionId);
        deny(connectorViolation(scope, { connector: target.connector, agentId: target.agentId }, { connector: "emission_id", agentId: "emission_id" }));
      }
      const emission = await deps.emissions.acknowledge(emissionId, outcome, request.remoteRef, request.detail);
      if (emission === undefined) throw new NotFoundError("emission", emissionId);
      return { emission: emissionToProto(emission) };
    },
  };
}
