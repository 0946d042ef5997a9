import type { AgentSpec } from "../domain/agent.js";
import type { Page } from "../domain/records.js";
import { AgentEntity } from "./entities/agent.entity.js";
import type { LedgerOrm } from "./orm.js";
import { decodePageToken, encodePageToken } from "./sql.js";

export interface AgentRepository {
  /** Stores the spec and returns it with its new revision. */
  put(spec: AgentSpec): Promise<AgentSpec>;
  get(agentId: string): Promise<AgentSpec | undefined>;
  list(pageSize: number, pageToken: string): Promise<Page<AgentSpec>>;
}

export function createAgentRepository(orm: LedgerOrm): AgentRepository {
  return {
    async put(spec) {
      const em = orm.em.fork();
      return em.transactional(async (tx) => {
        const existing = await tx.findOne(AgentEntity, { id: spec.id }, { lockMode: 4 /* PESSIMISTIC_WRITE */ });
        const revision = (existing?.revision ?? 0) + 1;
        const stored: AgentSpec = { ...spec, revision };
        if (existing === null) {
          tx.create(AgentEntity, { id: spec.id, spec: stored as unknown as Record<string, unknown>, revision });
        } else {
          existing.spec = stored as unknown as Record<string, unknown>;
          existing.revision = revision;
          existing.updatedAt = new Date();
        }
        return stored;
      });
    },
    async get(agentId) {
      const found = await orm.em.fork().findOne(AgentEntity, { id: agentId });
      return found === null ? undefined : (found.spec as unknown as AgentSpec);
    },
    async list(pageSize, pageToken) {
      const after = decodePageToken(pageToken);
      const found = await orm.em
        .fork()
        .find(AgentEntity, after === undefined ? {} : { id: { $gt: after } }, { orderBy: { id: "asc" }, limit: pageSize + 1 });
      const page = found.slice(0, pageSize);
      const last = page.at(-1);
      return {
        items: page.map((a) => a.spec as unknown as AgentSpec),
        nextPageToken: found.length > pageSize && last !== undefined ? encodePageToken(last.id) : "",
      };
    },
  };
}
