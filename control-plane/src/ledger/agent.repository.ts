import type { AgentSpec } from "../domain/agent.js";
import type { Page } from "../domain/records.js";
import { decodePageToken, encodePageToken, preparedRows, type Sql } from "./sql.js";

export interface AgentRepository {
  /** Stores the spec and returns it with its new revision. */
  put(spec: AgentSpec): Promise<AgentSpec>;
  get(agentId: string): Promise<AgentSpec | undefined>;
  list(pageSize: number, pageToken: string): Promise<Page<AgentSpec>>;
}

export function createAgentRepository(sql: Sql): AgentRepository {
  return {
    async put(spec) {
      // One statement: two processes putting the same agent at once (two `keel serve --dev` on
      // one database) both succeed, one revision after the other.
      const [row] = await preparedRows<{ spec: AgentSpec }>(
        sql,
        `INSERT INTO agents (id, spec, revision) VALUES (?, ?::jsonb, 1)
         ON CONFLICT (id) DO UPDATE SET
           spec = jsonb_set(excluded.spec, '{revision}', to_jsonb(agents.revision + 1)),
           revision = agents.revision + 1, updated_at = now()
         RETURNING spec`,
        [spec.id, JSON.stringify({ ...spec, revision: 1 })],
      );
      return row!.spec;
    },
    async get(agentId) {
      const [row] = await preparedRows<{ spec: AgentSpec }>(sql, "SELECT spec FROM agents WHERE id = ?", [agentId]);
      return row?.spec;
    },
    async list(pageSize, pageToken) {
      const after = decodePageToken(pageToken) ?? "";
      const found = await preparedRows<{ id: string; spec: AgentSpec }>(sql, "SELECT id, spec FROM agents WHERE id > ? ORDER BY id LIMIT ?", [after, pageSize + 1]);
      const page = found.slice(0, pageSize);
      const last = page.at(-1);
      return {
        items: page.map((row) => row.spec),
        nextPageToken: found.length > pageSize && last !== undefined ? encodePageToken(last.id) : "",
      };
    },
  };
}
