import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import { DeliveryStatus, EmissionService, SubscribeResponseSchema, type AcknowledgeEmissionRequest, type Emission, type SubscribeResponse } from "../../../gen/keel/v1/emission_service_pb.js";
import type { EmissionRecord } from "../domain/records.js";
import { InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError } from "../domain/errors.js";
import { agentViolation, connectorViolation, type ScopeViolation } from "../domain/token-scope.js";
import { requireSlug, requireUuid } from "../domain/ids.js";
import type { EmissionFeed } from "../ledger/emission-feed.js";
import type { AcknowledgeScope, Acknowledgement, EmissionQueries } from "../ledger/emission.repository.js";
import { principalOf } from "./auth.js";
import { emissionToProto, encodedSubscribeResponse } from "./convert.js";
import { dataFrame, frameSinkOf } from "./direct-frames.js";
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

/** Acknowledgements one AcknowledgeEmissions call may carry. */
export const MAX_ACKNOWLEDGEMENTS = 500;

/** One acknowledgement, validated; `path` prefixes the field names errors give. */
function acknowledgementOf(request: AcknowledgeEmissionRequest, path: string): Acknowledgement {
  const emissionId = requireUuid(`${path}emission_id`, request.emissionId);
  const outcome = OUTCOMES[request.outcome];
  if (outcome === undefined) throw new InvalidArgumentError(`${path}outcome`, "must be DELIVERED, FAILED or AMBIGUOUS");
  if (request.remoteRef.length > 1024) throw new InvalidArgumentError(`${path}remote_ref`, "must be at most 1024 characters");
  if (request.detail.length > 4096) throw new InvalidArgumentError(`${path}detail`, "must be at most 4096 characters");
  return { emissionId, outcome, remoteRef: request.remoteRef, detail: request.detail };
}

const deny = (violation: ScopeViolation | undefined): void => {
  if (violation !== undefined) throw new PermissionDeniedError(`${violation.field}: ${violation.reason}`);
};

export function createEmissionService(deps: EmissionServiceDeps): ServiceImpl<typeof EmissionService> {
  const streamsOfToken = new Map<string, number>();
  /**
   * Settles the acknowledgements in one statement, which touches none unless every emission
   * exists and is within the caller's scope; what comes back says which one was refused and why.
   */
  const settle = async (acknowledgements: readonly Acknowledgement[], context: HandlerContext, field: (i: number) => string): Promise<Emission[]> => {
    const { scope } = principalOf(context);
    const within: AcknowledgeScope =
      scope.kind === "role" ? { connectors: "any", agents: "any" } : scope.kind === "connector" ? scope : { connectors: [], agents: [] };
    const emissions = await deps.emissions.acknowledge(acknowledgements, within);
    const byId = new Map(emissions.map((emission) => [emission.id, emission]));
    return acknowledgements.map(({ emissionId }, i) => {
      const emission = byId.get(emissionId);
      if (emission === undefined) throw new NotFoundError("emission", emissionId);
      deny(connectorViolation(scope, { connector: emission.connector, agentId: emission.agentId }, { connector: field(i), agentId: field(i) }));
      return emissionToProto(emission);
    });
  };
  // The feed hands the same record to every stream of its connector: convert (and, for the binary
  // codecs, encode) it once for all of them.
  const converted = new WeakMap<EmissionRecord, { plain: SubscribeResponse; encoded?: SubscribeResponse; frame?: Uint8Array }>();
  const formsOf = (emission: EmissionRecord) => {
    let forms = converted.get(emission);
    if (forms === undefined) {
      forms = { plain: create(SubscribeResponseSchema, { emission: emissionToProto(emission) }) };
      converted.set(emission, forms);
    }
    return forms;
  };
  const encodedOf = (forms: ReturnType<typeof formsOf>): SubscribeResponse => (forms.encoded ??= encodedSubscribeResponse(forms.plain.emission as Emission));
  const responseOf = (emission: EmissionRecord, binary: boolean): SubscribeResponse => {
    const forms = formsOf(emission);
    return binary ? encodedOf(forms) : forms.plain;
  };
  /** The response as a data frame, for direct frames (direct-frames.ts). */
  const frameOf = (emission: EmissionRecord): Uint8Array => {
    const forms = formsOf(emission);
    return (forms.frame ??= dataFrame(toBinary(SubscribeResponseSchema, encodedOf(forms))));
  };
  return {
    async *subscribe(request, context) {
      const connector = requireSlug("connector", request.connector);
      const afterSeq = cursorOf("after_seq", request.afterSeq);
      const { scope } = principalOf(context);
      deny(connectorViolation(scope, { connector }));
      // A token limited to some agents sees only their emissions; the cursor still moves past the rest.
      const visible = (agentId: string) => agentViolation(scope, agentId, "agent_id") === undefined;
      const { tokenId, label } = principalOf(context);
      // gRPC, gRPC-Web and Connect name their JSON codec in the content type ("...+json" or "...json").
      const binary = !/json/i.test(context.requestHeader.get("content-type") ?? "");
      const open = streamsOfToken.get(tokenId) ?? 0;
      if (open >= deps.maxStreamsPerToken) {
        throw new ResourceExhaustedError(`token ${label || tokenId} already holds ${open} Subscribe streams, the most one token may hold`);
      }
      streamsOfToken.set(tokenId, open + 1);
      const frames = frameSinkOf(context);
      try {
        if (frames !== undefined) {
          // Binary calls: each emission's frame, encoded once, goes to the stream as the feed reads it.
          await deps.feed.pipe(connector, afterSeq, context.signal, (emission) => (visible(emission.agentId) ? frames.write(frameOf(emission)) : undefined));
          return;
        }
        for await (const emission of deps.feed.follow(connector, afterSeq, context.signal)) {
          if (visible(emission.agentId)) yield responseOf(emission, binary);
        }
      } finally {
        const left = (streamsOfToken.get(tokenId) ?? 1) - 1;
        if (left === 0) streamsOfToken.delete(tokenId);
        else streamsOfToken.set(tokenId, left);
      }
    },
    async acknowledgeEmission(request, context) {
      const [emission] = await settle([acknowledgementOf(request, "")], context, () => "emission_id");
      return { emission: emission! };
    },
    async acknowledgeEmissions(request, context) {
      const count = request.acknowledgements.length;
      if (count === 0) throw new InvalidArgumentError("acknowledgements", "must name at least one emission");
      if (count > MAX_ACKNOWLEDGEMENTS) throw new ResourceExhaustedError(`acknowledgements: at most ${MAX_ACKNOWLEDGEMENTS} per call, got ${count}`);
      const acknowledgements = request.acknowledgements.map((ack, i) => acknowledgementOf(ack, `acknowledgements[${i}].`));
      const seen = new Set<string>();
      acknowledgements.forEach(({ emissionId }, i) => {
        if (seen.has(emissionId)) throw new InvalidArgumentError(`acknowledgements[${i}].emission_id`, "names an emission already acknowledged in this call");
        seen.add(emissionId);
      });
      return { emissions: await settle(acknowledgements, context, (i) => `acknowledgements[${i}].emission_id`) };
    },
  };
}
