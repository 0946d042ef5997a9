// What the API reads to hold a connector token to its scope: which connector a conversation or
// a run belongs to, and for a run, whose interrupt counts under its agent's settings.
import type { InterruptScope } from "../domain/agent.js";
import type { RunAudience } from "../domain/interrupt.js";
import { statement, type Sql } from "./sql.js";

export interface RunScopeFacts {
  readonly connector: string;
  readonly agentId: string;
  readonly audience: RunAudience;
  /** The agent's interrupt scope; undefined when its spec names none. */
  readonly interruptScope: InterruptScope | undefined;
}

export interface ScopeLookups {
  /** The connector that opened the conversation (agent, external id), or undefined when it does not exist yet. */
  conversationConnector(agentId: string, externalConversationId: string): Promise<string | undefined>;
  runFacts(runId: string): Promise<RunScopeFacts | undefined>;
}

const conversationConnector = statement<{ agentId: string; externalId: string }, { connector: string }>("scope_conversation_connector")`
  SELECT connector FROM conversations WHERE agent_id = ${(p) => p.agentId} AND external_id = ${(p) => p.externalId}`;

/** The audience as conversation-run.rows.ts reads it: triggers that did not cancel, and who answered its questions. */
const runFacts = statement<
  { runId: string },
  { connector: string; agent_id: string; requested_by_actor_id: string; actors: string[] | null; interrupt_scope: string | null }
>("scope_run_facts")`
  SELECT r.connector, r.agent_id, r.requested_by_actor_id,
    (SELECT json_agg(DISTINCT a.actor_id) FROM (
       SELECT t.actor_id FROM run_triggers t WHERE t.run_id = r.id AND t.relation <> 'cancels'
       UNION SELECT i.resolved_by_actor_id FROM tool_invocations i
       WHERE i.run_id = r.id AND i.tool_name = 'keel.ask_user.v1' AND i.resolved_by_actor_id IS NOT NULL) a) AS actors,
    (SELECT g.spec -> 'interrupt' ->> 'scope' FROM agents g WHERE g.id = r.agent_id) AS interrupt_scope
  FROM runs r WHERE r.id = ${(p) => p.runId}::uuid`;

const INTERRUPT_SCOPES: readonly string[] = ["same_actor_only", "thread_scoped", "addressed_actor_only"] satisfies InterruptScope[];

export function createScopeLookups(sql: Sql): ScopeLookups {
  return {
    async conversationConnector(agentId, externalId) {
      const [row] = await sql.run(conversationConnector, { agentId, externalId });
      return row?.connector;
    },
    async runFacts(runId) {
      const [row] = await sql.run(runFacts, { runId });
      if (row === undefined) return undefined;
      const scope = row.interrupt_scope;
      return {
        connector: row.connector,
        agentId: row.agent_id,
        audience: { requesterId: row.requested_by_actor_id, addressedActorIds: row.actors ?? [] },
        interruptScope: scope !== null && INTERRUPT_SCOPES.includes(scope) ? (scope as InterruptScope) : undefined,
      };
    },
  };
}
