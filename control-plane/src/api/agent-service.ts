import type { ServiceImpl } from "@connectrpc/connect";
import { AgentService } from "../../../gen/keel/v1/agent_service_pb.js";
import { InvalidArgumentError, NotFoundError } from "../domain/errors.js";
import { requireSlug } from "../domain/ids.js";
import { parseAgentsPageToken, type AgentRepository } from "../ledger/agent.repository.js";
import { agentSpecFromProto, agentSpecToProto, type AgentSpecBounds } from "./agent-spec-convert.js";
import { createInstallSettingsRpcs, type InstallSettingsRpcDeps } from "./install-settings-rpcs.js";
import { pageSizeOf } from "./validate.js";

export interface AgentServiceDeps {
  readonly agents: AgentRepository;
  /** Where specs may read secrets from and which model endpoints they may name. */
  readonly bounds: Omit<AgentSpecBounds, "allowUnlistedEndpoints">;
  readonly installSettings: InstallSettingsRpcDeps;
}

/**
 * Sent with PutAgent to accept a model endpoint off KEEL_MODEL_ENDPOINTS. Only admins reach this
 * service; the header makes the choice explicit per call rather than a standing setting.
 */
export const ALLOW_UNLISTED_ENDPOINT_HEADER = "keel-allow-unlisted-model-endpoint";

export function createAgentService(deps: AgentServiceDeps): ServiceImpl<typeof AgentService> {
  return {
    ...createInstallSettingsRpcs(deps.installSettings),
    async putAgent(request, context) {
      const allowUnlistedEndpoints = context.requestHeader.get(ALLOW_UNLISTED_ENDPOINT_HEADER) === "true";
      const stored = await deps.agents.put(agentSpecFromProto(request.agent, { ...deps.bounds, allowUnlistedEndpoints }));
      return { agent: agentSpecToProto(stored) };
    },
    async getAgent(request) {
      const agentId = requireSlug("agent_id", request.agentId);
      const agent = await deps.agents.get(agentId);
      if (agent === undefined) throw new NotFoundError("agent", agentId);
      return { agent: agentSpecToProto(agent) };
    },
    async listAgents(request) {
      // A token the ledger did not issue is the caller's mistake, never read as "from the start".
      if (request.pageToken !== "" && parseAgentsPageToken(request.pageToken) === undefined) {
        throw new InvalidArgumentError("page_token", "is not a page token from ListAgents");
      }
      const page = await deps.agents.list(pageSizeOf(request.pageSize), request.pageToken);
      return { agents: page.items.map(agentSpecToProto), nextPageToken: page.nextPageToken };
    },
  };
}
