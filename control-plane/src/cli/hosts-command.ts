import { timestampDate } from "@bufbuild/protobuf/wkt";
import { RunService } from "../../../gen/keel/v1/run_service_pb.js";
import { connect, type ClientOptions } from "./client.js";
import { formatTable } from "./table.js";

/** The fleet's sandbox hosts: attached or not, workspaces in use of capacity, labels, last heartbeat. */
export async function hostsCommand(client: ClientOptions, out: (line: string) => void, now: () => Date = () => new Date()): Promise<number> {
  const runs = connect(RunService, client);
  const rows: string[][] = [];
  let pageToken = "";
  do {
    const page = await runs.listSandboxHosts({ pageSize: 500, pageToken });
    for (const host of page.hosts) {
      const beat = host.lastHeartbeatAt === undefined ? "never" : `${Math.max(0, Math.round((now().getTime() - timestampDate(host.lastHeartbeatAt).getTime()) / 1000))}s ago`;
      rows.push([
        host.hostId,
        host.connected ? `attached (${host.replicaId})` : "detached",
        `${host.workspacesInUse}/${host.capacity?.workspaces ?? 0}`,
        Object.entries(host.labels)
          .map(([key, value]) => `${key}=${value}`)
          .join(",") || "-",
        beat,
      ]);
    }
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  if (rows.length === 0) {
    out("no sandbox hosts yet: start one with `keel sandbox-agent --control-plane URL --token T`");
    return 0;
  }
  out(formatTable(["HOST", "STATE", "WORKSPACES", "LABELS", "HEARTBEAT"], rows));
  return 0;
}
