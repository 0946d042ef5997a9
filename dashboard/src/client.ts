// The only way the dashboard talks to Keel: generated clients over Connect, same origin. The
// bearer token is added per request from the session, so signing out takes effect at once.
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AgentService } from "../../gen/keel/v1/agent_service_pb.js";
import { RunService } from "../../gen/keel/v1/run_service_pb.js";
import { loadSession } from "./session.js";

const bearer: Interceptor = (next) => (request) => {
  const session = loadSession();
  if (session !== undefined) request.header.set("authorization", `Bearer ${session.token}`);
  return next(request);
};

const transport = createConnectTransport({ baseUrl: window.location.origin, useBinaryFormat: true, interceptors: [bearer] });

export const runService = createClient(RunService, transport);
/** Admin-only: the dashboard reads an agent's budget limits with it when the token allows. */
export const agentService = createClient(AgentService, transport);
