// What every TypeScript connector shares: clients of Keel's public API with a bearer token, and the
// names of emission kinds and ack states (a kind this build does not know is shown by its number, so
// kinds the core adds later still reach the user).
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { AckState, DeliveryStatus, EmissionKind, EmissionService, type Emission } from "../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../gen/keel/v1/ingress_service_pb.js";

export interface KeelClients {
  readonly ingress: Client<typeof IngressService>;
  readonly emissions: Client<typeof EmissionService>;
}

/** gRPC clients of IngressService and EmissionService at `url` (http://host:port), authenticated with `token`. */
export function keelClients(url: string, token: string): KeelClients {
  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
  const transport = createGrpcTransport({ baseUrl: url, interceptors: [bearer] });
  return { ingress: createClient(IngressService, transport), emissions: createClient(EmissionService, transport) };
}

/** `ack`, `reply`, … or `kind-7` for a kind this build has not heard of. */
export function kindName(kind: EmissionKind): string {
  const name = EmissionKind[kind] as string | undefined;
  return name === undefined ? `kind-${kind}` : name.toLowerCase();
}

/** `working`, `succeeded`, … or `state-5` for an ack state this build has not heard of. */
export function ackStateName(state: AckState): string {
  const name = AckState[state] as string | undefined;
  return name === undefined ? `state-${state}` : name.toLowerCase();
}

/**
 * Whether a connector should still deliver this emission. Subscribe replays everything after the
 * cursor, settled or not; one already DELIVERED, FAILED or AMBIGUOUS is never sent again (a rewound
 * cursor must not repeat what the peer may already have).
 */
export function awaitsDelivery(emission: Emission): boolean {
  return emission.deliveryStatus === DeliveryStatus.PENDING || emission.deliveryStatus === DeliveryStatus.UNSPECIFIED;
}
