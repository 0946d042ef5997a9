import type { ServiceImpl } from "@connectrpc/connect";
import { DeliveryStatus, EmissionService } from "../../../gen/keel/v1/emission_service_pb.js";
import { InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError } from "../domain/errors.js";
import { agentViolation, connectorViolation, type ScopeViolation } from "../domain/token-scope.js";
import { requireSlug, requireUuid } from "../domain/ids.js";
import type { EmissionFeed } from "../ledger/emission-feed.js";
import type { EmissionQueries } from "../ledger/emission.repository.js";
import { principalOf } from "./auth.js";
import { emissionToProto } from "./convert.js";
import { cursorOf } from "./validate.js";

export interface EmissionServiceDeps {
  readonly emissions: EmissionQueries;
  /** The process's one reader, fanning new emissions out to every stream. */
  readonly feed: EmissionFeed;
  /** Open Subscribe streams one token may hold; more is ResourceExhausted. */
  readonly maxStreamsPerToken: number;
}

const OUTCOMES: Partial<Record<DeliveryStatus, "delivered" | "failed" | "ambiguous">> = {
  [DeliveryStatus.DELIVERED]: "delivered",
  [DeliveryStatus.FAILED]: "failed",
  [DeliveryStatus.AMBIGUOUS]: "ambiguous",
};

const deny = (violation: ScopeViolation | undefined): void => {
  if (violation !== undefined) throw new PermissionDeniedError(`${violation.field}: ${violation.reason}`);
};

export function createEmissionService(deps: EmissionServiceDeps): ServiceImpl<typeof EmissionService> {
  const streamsOfToken = new Map<string, number>();
  return {
    async *subscribe(request, context) {
      const connector = requireSlug("connector", request.connector);
      const { scope } = principalOf(context);
      deny(connectorViolation(scope, { connector }));
      // A token limited to some agents sees only their emissions; the cursor still moves past the rest.
      const visible = (agentId: string) => agentViolation(scope, agentId, "agent_id") === undefined;
      const { tokenId, label } = principalOf(context);
      const open = streamsOfToken.get(tokenId) ?? 0;
      if (open >= deps.maxStreamsPerToken) {
        throw new ResourceExhaustedError(`token ${label || tokenId} already holds ${open} Subscribe streams, the most one token may hold`);
      }
      streamsOfToken.set(tokenId, open + 1);
      try {
        for await (const emission of deps.feed.follow(connector, cursorOf("after_seq", request.afterSeq), context.signal)) {
          if (visible(emission.agentId)) yield { emission: emissionToProto(emission) };
        }
      } finally {
        const left = (streamsOfToken.get(tokenId) ?? 1) - 1;
        if (left === 0) streamsOfToken.delete(tokenId);
        else streamsOfToken.set(tokenId, left);
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
