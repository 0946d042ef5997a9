import type { AgentSpec } from "../domain/agent.js";
import type { Page } from "../domain/records.js";
import { decodePageToken, encodePageToken, statement, type Sql } from "./sql.js";

export interface AgentRepository {
  /** Stores the spec and returns it with its new revision. */
  put(spec: AgentSpec): Promise<AgentSpec>;
  get(agentId: string): Promise<AgentSpec | undefined>;
  list(pageSize: number, pageToken: string): Promise<Page<AgentSpec>>;
}

// One statement: two processes putting the same agent at once (two `keel serve --dev` on one
// database) both succeed, one revision after the other.
const putAgent = statement<{ id: string; spec: string }, { spec: AgentSpec }>("put_agent")`
  INSERT INTO agents (id, spec, revision) VALUES (${(p) => p.id}, ${(p) => p.spec}::jsonb, 1)
  ON CONFLICT (id) DO UPDATE SET
    spec = jsonb_set(excluded.spec, '{revision}', to_jsonb(agents.revision + 1)),
    revision = agents.revision + 1, updated_at = now()
  RETURNING spec`;

const selectAgent = statement<{ id: string }, { spec: AgentSpec }>("select_agent")`
  SELECT spec FROM agents WHERE id = ${(p) => p.id}`;

const listAgents = statement<{ after: string; limit: number }, { id: string; spec: AgentSpec }>("list_agents")`
  SELECT id, spec FROM agents WHERE id > ${(p) => p.after} ORDER BY id LIMIT ${(p) => p.limit}`;

/**
 * The agent id a ListAgents page token carries, or undefined for a token the ledger did not issue.
 * Base64url decoding skips characters it does not know, so only a token that encodes back to
 * itself is one of ours; an id with NUL could not be stored (PostgreSQL text refuses it).
 */
export function parseAgentsPageToken(token: string): string | undefined {
  const id = decodePageToken(token);
  return id !== undefined && id !== "" && !id.includes("\0") && encodePageToken(id) === token ? id : undefined;
}

export function createAgentRepository(sql: Sql): AgentRepository {
  return {
    async put(spec) {
      const [row] = await sql.run(putAgent, { id: spec.id, spec: JSON.stringify({ ...spec, revision: 1 }) });
      return row!.spec;
    },
    async get(agentId) {
      const [row] = await sql.run(selectAgent, { id: agentId });
      return row?.spec;
    },
    async list(pageSize, pageToken) {
      const found = await sql.run(listAgents, { after: decodePageToken(pageToken) ?? "", limit: pageSize + 1 });
      const page = found.slice(0, pageSize);
      const last = page.at(-1);
      return {
        items: page.map((row) => row.spec),
        nextPageToken: found.length > pageSize && last !== undefined ? encodePageToken(last.id) : "",
      };
    },
  };
}
