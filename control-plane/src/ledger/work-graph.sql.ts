// The statements of work-graph.repository.ts: a proposal's facts, an admitted graph's rows and
// its root parked, a scheduler pass's reads and writes (child runs with their input message and
// attempt), and the graph as GetWorkGraph shows it.
import { DEFAULT_GRAPH_CEILINGS } from "../domain/agent.js";
import { EXECUTING_STATUSES, isTerminal, LIVE_STATUSES, RUN_STATUSES, ZERO_USAGE, type RunStatus, type RunUsage } from "../domain/run.js";
import { fragment, raw, statement } from "./sql.js";

const list = (statuses: readonly RunStatus[]): string => statuses.map((s) => `'${s}'`).join(", ");
const TERMINAL_SQL = list(RUN_STATUSES.filter(isTerminal));
const EXECUTING_SQL = list(EXECUTING_STATUSES);
const LIVE_SQL = list(LIVE_STATUSES);
/** Why a root waits while its graph runs (WaitReason AWAITING_CHILDREN on the wire). */
export const AWAITING_CHILDREN = "awaiting_children";
/** Why a root waits while nothing runs but a gate waits for its decision (WaitReason HUMAN_GATE). */
export const HUMAN_GATE = "human_gate";

const runId = (p: { readonly runId: string }) => p.runId;
const rootRunId = (p: { readonly rootRunId: string }) => p.rootRunId;
const graphId = (p: { readonly graphId: string }) => p.graphId;

export interface FactsRow {
  connector: string;
  usage: Partial<RunUsage>;
  started_at: Date;
  child: boolean;
  last_graph: { status: string; revision: number; replans: number; finished: FinishedNodeJson[] | null } | null;
  rejected: number;
}

/** A node that succeeded, as a revision may keep it. */
export interface FinishedNodeJson {
  key: string;
  kind: string;
  objective: string;
  depends_on: string[];
  output: string | null;
}

export const proposerFacts = statement<{ runId: string; toolName: string }, FactsRow>("work_graph_proposer_facts")`
  SELECT r.connector, r.usage, coalesce(r.started_at, r.created_at) AS started_at, r.parent_run_id IS NOT NULL AS child,
    (SELECT json_build_object('status', g.status, 'revision', g.revision, 'replans', g.replans,
       -- Only a revision keeps finished nodes: their outputs are read for nothing else.
       'finished', (SELECT json_agg(json_build_object('key', n.key, 'kind', n.kind, 'objective', n.objective, 'depends_on', n.depends_on, 'output', n.output)
                    ORDER BY n.ordinal) FROM work_nodes n WHERE g.status = 'revised' AND n.graph_id = g.id AND n.status = 'succeeded'))
     FROM work_graphs g WHERE g.root_run_id = r.id ORDER BY g.revision DESC LIMIT 1) AS last_graph,
    (SELECT count(*)::int FROM tool_invocations t WHERE t.run_id = r.id AND t.status = 'failed' AND t.tool_name = ${(p) => p.toolName}) AS rejected
  FROM runs r WHERE r.id = ${runId}::uuid`;

/** Parks the proposing root, fenced by its epoch; a stop requested meanwhile wins (nothing is parked). */
export const parkRoot = statement<{ runId: string; epoch: number }, { id: string }>("work_graph_park_root")`
  UPDATE runs SET shape = 'graph', status = 'waiting', wait_reason = ${raw(`'${AWAITING_CHILDREN}'`)}, lease_owner = NULL,
    lease_expires_at = NULL, lease_epoch = lease_epoch + 1, updated_at = now()
  WHERE id = ${runId}::uuid AND lease_epoch = ${(p) => p.epoch}::bigint AND status IN (${raw(EXECUTING_SQL)})
    AND cancel_requested_by_actor_id IS NULL AND superseded_by_run_id IS NULL
  RETURNING id`;

export const insertGraph = statement<{ graphId: string; runId: string; invocationId: string; revision: number; replans: number }>("work_graph_insert")`
  INSERT INTO work_graphs (id, root_run_id, aggregate_usage, status, proposed_by_invocation_id, revision, replans)
  VALUES (${graphId}::uuid, ${runId}::uuid, '{}'::jsonb, 'running', ${(p) => p.invocationId}::uuid, ${(p) => p.revision}::int, ${(p) => p.replans}::int)`;

/** A graph's nodes, pending; a revision's kept nodes succeeded already, with their output (and no attempt). */
export const insertNodes = statement<{ graphId: string; nodes: string }>("work_graph_insert_nodes")`
  INSERT INTO work_nodes (id, graph_id, key, kind, status, objective, depends_on, ordinal, child_spec, subject, needs_workspace, output, finished_at)
  SELECT n.id, ${graphId}::uuid, n.key, n.kind, CASE WHEN n.kept_output IS NULL THEN 'pending' ELSE 'succeeded' END, n.objective, n.depends_on,
    n.ordinal, n.child_spec, n.subject, n.needs_workspace, n.kept_output, CASE WHEN n.kept_output IS NULL THEN NULL ELSE now() END
  FROM jsonb_to_recordset(${(p) => p.nodes}::jsonb)
    AS n(id uuid, key text, kind text, objective text, depends_on jsonb, ordinal int, child_spec jsonb, subject text, needs_workspace boolean, kept_output text)`;

export interface LockedGraphRow {
  id: string;
  /** The root's agent spec as stored: a child's is it with the node's override merged over (as a claim merges them). */
  agent_spec: Record<string, unknown>;
  proposed_by_invocation_id: string | null;
  root_status: RunStatus;
  root_wait_reason: string | null;
  root_usage: Partial<RunUsage>;
  agent_id: string;
  conversation_id: string;
  connector: string;
  requested_by_actor_id: string;
  max_parallelism: number;
  revision: number;
  replans: number;
  max_replans: number;
  max_revisions: number;
  /** A refinement amended the root after it proposed this graph, and a revision is left. */
  revision_due: boolean;
}

/** The revision ceiling of graph `g`'s agent `a`. */
const MAX_REVISIONS_SQL = `coalesce((a.spec -> 'graph' ->> 'maxRevisions')::int, ${DEFAULT_GRAPH_CEILINGS.maxRevisions})`;

/**
 * Whether graph `g` (agent `a`) is to be revised: its root took an amendment (a refinement or an
 * edit) after the step that proposed it, and the agent's revision ceiling leaves one more.
 */
const REVISION_DUE_SQL = `(g.revision - g.replans < ${MAX_REVISIONS_SQL} AND EXISTS (
    SELECT 1 FROM tool_invocations p JOIN run_steps s ON s.id = p.step_id JOIN run_triggers t ON t.run_id = g.root_run_id
    WHERE p.id = g.proposed_by_invocation_id AND NOT t.inherited AND t.relation IN ('amends', 'edit') AND t.after_step > s.index))`;

/**
 * The live graph of a root, locked for one pass: passes over one graph take turns. A pass commits
 * without waiting for its WAL flush, in either durability mode: everything it writes is derived
 * from committed rows and a lost pass is redone by the next one (the sweep), and whatever could
 * depend on it (a child's claim, the woken root's claim) is a durable commit later in the WAL,
 * which flushes the pass first.
 */
export const lockGraph = statement<{ rootRunId: string }, LockedGraphRow>("work_graph_lock")`
  WITH durability AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
  SELECT g.id, a.spec AS agent_spec, g.proposed_by_invocation_id, r.status AS root_status, r.wait_reason AS root_wait_reason, r.usage AS root_usage, r.agent_id, r.conversation_id, r.connector,
    r.requested_by_actor_id,
    coalesce(nullif((a.spec -> 'graph' ->> 'maxParallelism')::int, 0), ${raw(String(DEFAULT_GRAPH_CEILINGS.maxParallelism))}) AS max_parallelism,
    g.revision, g.replans, coalesce((a.spec -> 'graph' ->> 'maxReplans')::int, ${raw(String(DEFAULT_GRAPH_CEILINGS.maxReplans))}) AS max_replans,
    ${raw(MAX_REVISIONS_SQL)} AS max_revisions, ${raw(REVISION_DUE_SQL)} AS revision_due
  FROM durability, work_graphs g JOIN runs r ON r.id = g.root_run_id JOIN agents a ON a.id = r.agent_id
  WHERE g.root_run_id = ${rootRunId}::uuid AND g.status = 'running'
  FOR NO KEY UPDATE OF g`;

export interface PassNodeRow {
  id: string;
  key: string;
  kind: string;
  status: string;
  objective: string;
  depends_on: string[];
  subject: string | null;
  needs_workspace: boolean;
  output: string | null;
  child_spec: Record<string, unknown> | null;
  attempt_id: string | null;
  attempt_ordinal: number | null;
  child_run_id: string | null;
  /** needs_workspace only: whether the child's workspace is still there ('active'), was ('gone') or never was ('none'). */
  child_workspace: "active" | "gone" | "none" | null;
  child_status: RunStatus | null;
  final_reply: string | null;
  error: string | null;
  child_usage: Partial<RunUsage> | null;
  gate_decision: string | null;
  gate_decided_by_actor_id: string | null;
  gate_reason: string | null;
}

/** Every node with its latest attempt and that attempt's child run, in admitted (topological) order. */
export const passNodes = statement<{ graphId: string }, PassNodeRow>("work_graph_pass_nodes")`
  SELECT n.id, n.key, n.kind, n.status, n.objective, n.depends_on, n.subject, n.needs_workspace, n.output, n.child_spec,
    n.gate_decision, n.gate_decided_by_actor_id, n.gate_reason, t.id AS attempt_id, t.ordinal AS attempt_ordinal, t.child_run_id, c.status AS child_status, c.final_reply, c.error, c.usage AS child_usage,
    CASE WHEN n.needs_workspace THEN (SELECT CASE WHEN bool_or(w.status = 'active') THEN 'active' WHEN count(*) > 0 THEN 'gone' ELSE 'none' END
      FROM workspaces w WHERE w.run_id = t.child_run_id) END AS child_workspace
  FROM work_nodes n
  LEFT JOIN LATERAL (SELECT a.id, a.ordinal, a.child_run_id FROM work_node_attempts a WHERE a.node_id = n.id ORDER BY a.ordinal DESC LIMIT 1) t ON true
  LEFT JOIN runs c ON c.id = t.child_run_id
  WHERE n.graph_id = ${graphId}::uuid ORDER BY n.ordinal`;

/** A pass's node changes and its settled attempts ([{ id, status, output }] and [{ id, status }]). */
interface SettleParams {
  readonly nodes: string;
  readonly attempts: string;
}

/** The settlement as CTEs `settled_attempts` and `settled_nodes`, so starting children can share its round trip. */
const SETTLE_CTES = fragment<SettleParams>`settled_attempts AS (
    UPDATE work_node_attempts a SET status = u.status, finished_at = now()
    FROM jsonb_to_recordset(${(p) => p.attempts}::jsonb) AS u(id uuid, status text) WHERE a.id = u.id),
  settled_nodes AS (
    UPDATE work_nodes n SET status = u.status, output = coalesce(u.output, n.output),
      finished_at = CASE WHEN u.status IN ('succeeded', 'failed', 'cancelled') THEN now() ELSE n.finished_at END
    FROM jsonb_to_recordset(${(p) => p.nodes}::jsonb) AS u(id uuid, status text, output text) WHERE n.id = u.id)`;

/** A pass's node changes and its settled attempts, in one round trip (two tables, so no row is updated twice). */
export const settleNodes = statement<SettleParams>("work_graph_settle_nodes")`
  WITH ${SETTLE_CTES} SELECT 1`;

/**
 * Reconciled joins settle: only one still due (ready) under the root's live graph, so a
 * reconciliation another process finished first, or one of a graph that ended meanwhile, writes nothing.
 */
export const settleJoins = statement<{ rootRunId: string; joins: string }, { id: string }>("work_graph_settle_joins")`
  UPDATE work_nodes n SET status = u.status, output = u.output, finished_at = now()
  FROM jsonb_to_recordset(${(p) => p.joins}::jsonb) AS u(id uuid, status text, output text), work_graphs g
  WHERE n.id = u.id AND n.kind = 'join' AND n.status = 'ready' AND g.id = n.graph_id AND g.root_run_id = ${rootRunId}::uuid AND g.status = 'running'
  RETURNING n.id`;

export interface StartChildrenParams {
  readonly rootRunId: string;
  readonly agentId: string;
  readonly conversationId: string;
  readonly connector: string;
  readonly actorId: string;
  /**
   * [{ run_id, message_id, attempt_id, node_id, ordinal, input, spec, summary, worker_id, lease_ms }]: a child with a
   * worker_id starts claimed by that idle worker of this process (lease epoch 1), with no wake-up.
   */
  readonly children: string;
  /**
   * When the children are due: now on Keel's clock, which the claim's start rule reads. The
   * database's now() could be later (a skewed host, or a microsecond past a claim in the same
   * millisecond), and a queued child would then look like a coalescing run to a claim.
   */
  readonly notBefore: Date;
}

/**
 * Child runs, queued (or claimed for an idle worker): the root's agent and conversation, no reply
 * target (a child answers its node, not the thread), its own logical request, the node's spec
 * override and slice as its budget; one input message each, the node's attempt, a wake-up per
 * queued child, and the root's event saying what started. The pass's settlement rides along: it
 * touches other nodes and attempts than the ones started, so no row is updated twice.
 */
export const startChildren = statement<StartChildrenParams & SettleParams & { rootSummary: string }, { id: string }>("work_graph_start_children")`
  WITH ${SETTLE_CTES},
  c AS (
    SELECT x.run_id, x.message_id, x.attempt_id, x.node_id, x.ordinal, x.input, x.spec, x.summary, x.worker_id, x.lease_ms
    FROM jsonb_to_recordset(${(p) => p.children}::jsonb)
      AS x(run_id uuid, message_id uuid, attempt_id uuid, node_id uuid, ordinal int, input text, spec jsonb, summary text, worker_id text, lease_ms int)),
  new_runs AS (
    INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, logical_request_id,
      parent_run_id, root_run_id, spec_override, trigger_count, event_seq, request_received_at, not_before,
      lease_owner, lease_epoch, lease_expires_at, started_at)
    SELECT c.run_id, ${(p) => p.agentId}, ${(p) => p.conversationId}::uuid, ${(p) => p.connector},
      CASE WHEN c.worker_id IS NULL THEN 'queued' ELSE 'running' END, ${(p) => p.actorId},
      c.spec -> 'budget', ${raw(`'${JSON.stringify(ZERO_USAGE)}'::jsonb`)}, c.run_id, ${rootRunId}::uuid, ${rootRunId}::uuid, c.spec, 1,
      CASE WHEN c.worker_id IS NULL THEN 1 ELSE 2 END, now(), ${(p) => p.notBefore}::timestamptz,
      c.worker_id, CASE WHEN c.worker_id IS NULL THEN 0 ELSE 1 END,
      CASE WHEN c.worker_id IS NULL THEN NULL ELSE now() + make_interval(secs => c.lease_ms / 1000.0) END,
      CASE WHEN c.worker_id IS NULL THEN NULL ELSE now() END
    FROM c
    RETURNING id, lease_owner),
  messages AS (
    INSERT INTO messages (id, conversation_id, external_id, actor_id, text, run_id)
    SELECT c.message_id, ${(p) => p.conversationId}::uuid, 'graph-node:' || c.node_id || ':' || c.ordinal, ${(p) => p.actorId}, c.input, c.run_id
    FROM c),
  triggers AS (
    INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, relation)
    SELECT c.run_id, c.message_id, ${(p) => p.actorId}, 'graph-node:' || c.node_id || ':' || c.ordinal, 'initial' FROM c),
  attempts AS (
    INSERT INTO work_node_attempts (id, node_id, ordinal, status, replayability, child_run_id)
    SELECT c.attempt_id, c.node_id, c.ordinal, 'running', 'replayable', c.run_id FROM c),
  events AS (
    INSERT INTO run_events (run_id, seq, kind, status, summary)
    SELECT c.run_id, 1, 'created', 'queued', c.summary FROM c
    UNION ALL
    SELECT c.run_id, 2, 'status_changed', 'running', 'claimed by ' || c.worker_id || ' at epoch 1, handed over by the work graph pass'
    FROM c WHERE c.worker_id IS NOT NULL),
  root_event AS (
    UPDATE runs SET event_seq = event_seq + 1 WHERE id = ${rootRunId}::uuid RETURNING id, event_seq),
  root_event_row AS (
    INSERT INTO run_events (run_id, seq, kind, status, summary)
    SELECT id, event_seq, 'status_changed', 'waiting', ${(p) => p.rootSummary} FROM root_event),
  nodes AS (
    UPDATE work_nodes n SET status = 'running' FROM c WHERE n.id = c.node_id)
  SELECT new_runs.id, CASE WHEN new_runs.lease_owner IS NULL THEN pg_notify('keel_runs', new_runs.id::text) END AS notified FROM new_runs`;

export const finishGraph = statement<{ graphId: string; status: string; usage: string }>("work_graph_finish")`
  UPDATE work_graphs SET status = ${(p) => p.status}, finished_at = now(), aggregate_usage = ${(p) => p.usage}::jsonb
  WHERE id = ${graphId}::uuid`;

/** The proposing call gets the graph's result: the root's transcript then reads it like any result. */
export const settleProposal = statement<{ invocationId: string; rootRunId: string; text: string }, { id: string }>("work_graph_settle_proposal")`
  UPDATE tool_invocations SET status = 'succeeded', result_text = ${(p) => p.text}, finished_at = now()
  WHERE id = ${(p) => p.invocationId}::uuid AND run_id = ${rootRunId}::uuid AND status = 'pending'
  RETURNING id`;

/** The root queued again with its children's spend added to its own (one aggregate budget). */
export const wakeRoot = statement<{ rootRunId: string; usage: string }, { id: string }>("work_graph_wake_root")`
  UPDATE runs SET status = 'queued', wait_reason = CASE WHEN paused THEN 'paused' ELSE NULL END, usage = ${(p) => p.usage}::jsonb,
    updated_at = now()
  WHERE id = ${rootRunId}::uuid AND status = 'waiting'
  RETURNING id, pg_notify('keel_runs', id::text) AS notified`;

/** Why the parked root waits: on its children, or on a gate's decision when nothing else runs. */
export const rootWaitReason = statement<{ rootRunId: string; reason: string }>("work_graph_root_wait_reason")`
  UPDATE runs SET wait_reason = ${(p) => p.reason}, updated_at = now()
  WHERE id = ${rootRunId}::uuid AND status = 'waiting' AND wait_reason IN (${raw(`'${AWAITING_CHILDREN}', '${HUMAN_GATE}'`)})
    AND wait_reason <> ${(p) => p.reason}`;

export interface GateRow {
  graph_id: string;
  root_run_id: string;
  id: string;
  key: string;
  kind: string;
  status: string;
  gate_decision: string | null;
  gate_decided_by_actor_id: string | null;
}

/**
 * A node of the graph of run runId's root, by id or key, with the graph's row locked so a
 * decision and a pass take turns; an ended graph's nodes say why a late decision is refused.
 * Nothing when the run has no graph or no such node.
 */
export const lockGate = statement<{ runId: string; gate: string }, GateRow>("work_graph_lock_gate")`
  SELECT g.id AS graph_id, g.root_run_id, n.id, n.key, n.kind, n.status, n.gate_decision, n.gate_decided_by_actor_id
  FROM work_graphs g JOIN work_nodes n ON n.graph_id = g.id
  WHERE g.root_run_id = (SELECT coalesce(r.root_run_id, r.id) FROM runs r WHERE r.id = ${runId}::uuid)
    AND g.revision = (SELECT max(l.revision) FROM work_graphs l WHERE l.root_run_id = g.root_run_id)
    AND (n.key = ${(p) => p.gate} OR n.id::text = ${(p) => p.gate})
  FOR NO KEY UPDATE OF g`;

export const recordGateDecision = statement<{ nodeId: string; decision: string; actorId: string; reason: string }, { id: string }>("work_graph_decide_gate")`
  UPDATE work_nodes SET gate_decision = ${(p) => p.decision}, gate_decided_by_actor_id = ${(p) => p.actorId},
    gate_reason = ${(p) => p.reason}, gate_decided_at = now()
  WHERE id = ${(p) => p.nodeId}::uuid AND kind = 'human_gate' AND status = 'blocked' AND gate_decision IS NULL
  RETURNING id`;

/** A stopped root stops its children at their next safe point. */
export const cancelChildren = statement<{ rootRunId: string }, { id: string }>("work_graph_cancel_children")`
  UPDATE runs SET cancel_requested_by_actor_id = 'keel-work-graph', cancel_reason = 'the root run stopped', updated_at = now()
  WHERE parent_run_id = ${rootRunId}::uuid AND status IN (${raw(LIVE_SQL)}) AND cancel_requested_by_actor_id IS NULL
  RETURNING id, pg_notify('keel_run_control', id::text) AS notified, pg_notify('keel_runs', id::text) AS woken`;

/**
 * Live graphs a pass would move on: a child settled under a running node, a gate decided, a join
 * due for reconciliation, the root stopped, or a revision due with nothing running (while a node runs, its settlement pokes the pass).
 */
export const stalledRoots = statement<Record<string, never>, { root_run_id: string }>("work_graph_stalled")`
  SELECT g.root_run_id FROM work_graphs g JOIN runs r ON r.id = g.root_run_id JOIN agents a ON a.id = r.agent_id
  WHERE g.status = 'running' AND (r.status IN (${raw(TERMINAL_SQL)}) OR EXISTS (
    SELECT 1 FROM work_nodes n JOIN work_node_attempts a ON a.node_id = n.id AND a.status = 'running'
      JOIN runs c ON c.id = a.child_run_id
    WHERE n.graph_id = g.id AND c.status IN (${raw(TERMINAL_SQL)}))
    OR EXISTS (SELECT 1 FROM work_nodes n WHERE n.graph_id = g.id AND n.status = 'blocked' AND n.gate_decision IS NOT NULL)
    OR EXISTS (SELECT 1 FROM work_nodes n WHERE n.graph_id = g.id AND n.kind = 'join' AND n.status = 'ready')
    OR (${raw(REVISION_DUE_SQL)} AND NOT EXISTS (SELECT 1 FROM work_nodes n WHERE n.graph_id = g.id AND n.status = 'running')))
  LIMIT 100`;

export interface GraphViewRow {
  id: string;
  root_run_id: string;
  revision: number;
  replans: number;
  status: string;
  created_at: Date;
  child_usages: Partial<RunUsage>[] | null;
}

export const graphView = statement<{ runId: string }, GraphViewRow>("work_graph_view")`
  SELECT g.id, g.root_run_id, g.revision, g.replans, g.status, g.created_at,
    (SELECT json_agg(c.usage) FROM runs c WHERE c.parent_run_id = g.root_run_id) AS child_usages
  FROM work_graphs g
  WHERE g.root_run_id = (SELECT coalesce(r.root_run_id, r.id) FROM runs r WHERE r.id = ${runId}::uuid)
  ORDER BY g.revision DESC LIMIT 1`;

export interface AttemptJson {
  id: string;
  ordinal: number;
  status: string;
  replayability: string;
  child_run_id: string | null;
  started_at: string;
  finished_at: string | null;
}

export interface NodeViewRow {
  id: string;
  key: string;
  kind: string;
  status: string;
  objective: string;
  depends_on: string[];
  gate_decision: string | null;
  gate_decided_by_actor_id: string | null;
  gate_reason: string | null;
  attempts: AttemptJson[] | null;
}

export const nodesView = statement<{ graphId: string }, NodeViewRow>("work_graph_view_nodes")`
  SELECT n.id, n.key, n.kind, n.status, n.objective, n.depends_on, n.gate_decision, n.gate_decided_by_actor_id, n.gate_reason,
    (SELECT json_agg(json_build_object('id', a.id, 'ordinal', a.ordinal, 'status', a.status, 'replayability', a.replayability,
        'child_run_id', a.child_run_id, 'started_at', a.started_at, 'finished_at', a.finished_at) ORDER BY a.ordinal)
     FROM work_node_attempts a WHERE a.node_id = n.id) AS attempts
  FROM work_nodes n WHERE n.graph_id = ${graphId}::uuid ORDER BY n.ordinal`;
