// `keel health`: asks a server's standard gRPC health service (no token needed) and exits 0 only
// when it answers SERVING; the container health checks use it.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../../gen/grpc/health/v1/health_pb.js";
import { resolveUrl } from "./client.js";

export const HEALTH_USAGE = "keel health [--url U] [--ca F] [--service NAME] [--timeout-ms N]";

export async function healthCommand(args: readonly string[], env: Readonly<Record<string, string | undefined>>, out: (line: string) => void): Promise<number> {
  const { values } = parseArgs({
    args: [...args],
    options: { url: { type: "string" }, ca: { type: "string" }, service: { type: "string", default: "" }, "timeout-ms": { type: "string", default: "3000" } },
  });
  const timeoutMs = Number(values["timeout-ms"]);
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) throw new Error(`--timeout-ms must be a positive integer, not ${JSON.stringify(values["timeout-ms"])}`);
  const caFile = values.ca ?? env["KEEL_CA"];
  const transport = createGrpcTransport({
    baseUrl: resolveUrl(values.url, env),
    ...(caFile === undefined || caFile === "" ? {} : { nodeOptions: { ca: readFileSync(caFile, "utf8") } }),
  });
  const { status } = await createClient(Health, transport).check({ service: values.service }, { timeoutMs });
  out(Status[status]);
  return status === Status.SERVING ? 0 : 1;
}
