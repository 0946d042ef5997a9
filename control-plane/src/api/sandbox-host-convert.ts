// RunService.ListSandboxHosts on the wire: a host as the ledger has it, and the page token (the
// last host id of a page, opaque to callers).
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { SandboxHostViewSchema, type SandboxHostView as SandboxHostViewProto } from "../../../gen/keel/v1/run_service_pb.js";
import { HostCapacitySchema } from "../../../gen/keel/v1/sandbox_service_pb.js";
import { InvalidArgumentError } from "../domain/errors.js";
import type { SandboxHostView } from "../ledger/sandbox-host-view.repository.js";

export const MAX_HOSTS_PAGE = 500;
const TOKEN_PREFIX = "hosts-after:";

export function sandboxHostToProto(host: SandboxHostView): SandboxHostViewProto {
  return create(SandboxHostViewSchema, {
    hostId: host.hostId,
    capacity: create(HostCapacitySchema, { workspaces: host.capacity.workspaces, cpuMillis: host.capacity.cpuMillis, memoryBytes: BigInt(host.capacity.memoryBytes) }),
    labels: { ...host.labels },
    backends: [...host.backends],
    images: [...host.images],
    connected: host.connected,
    replicaId: host.replicaId,
    ...(host.lastHeartbeatAt === undefined ? {} : { lastHeartbeatAt: timestampFromDate(host.lastHeartbeatAt) }),
    registeredAt: timestampFromDate(host.registeredAt),
    workspacesInUse: host.workspacesInUse,
    runIds: [...host.runIds],
  });
}

export function encodeHostsPageToken(lastHostId: string): string {
  return TOKEN_PREFIX + Buffer.from(lastHostId, "utf8").toString("base64url");
}

export function parseHostsPageToken(token: string): string {
  const encoded = token.startsWith(TOKEN_PREFIX) ? token.slice(TOKEN_PREFIX.length) : "";
  const hostId = Buffer.from(encoded, "base64url").toString("utf8");
  if (hostId === "" || encodeHostsPageToken(hostId) !== token) throw new InvalidArgumentError("page_token", "is not a page token from ListSandboxHosts");
  return hostId;
}
