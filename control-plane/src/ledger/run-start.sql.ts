// The run-start rule of domain/run-start.ts and the status sets of domain/run.ts, rendered into
// SQL once for every statement that needs them. test/run-start-rule.test.ts runs this SQL
// against generated ledgers and compares it with the domain function.
import { DEFAULT_MAX_CONCURRENT_ROOT_RUNS } from "../domain/agent.js";
import { EXECUTING_STATUSES, LIVE_STATUSES, PARKED_STATUSES, type RunStatus } from "../domain/run.js";
import { DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS } from "../domain/run-start.js";
import { fragment, raw, type StatementFragment } from "./sql-text.js";

const list = (statuses: readonly RunStatus[]): string => statuses.map((s) => `'${s}'`).join(", ");

/** `'queued', 'running', …` for `status IN (…)`. */
export const LIVE_SQL = list(LIVE_STATUSES);
export const PARKED_SQL = list(PARKED_STATUSES);
export const EXECUTING_SQL = list(EXECUTING_STATUSES);
/** A claim takes a queued run the rule lets start, or an executing one whose lease expired. */
export const CLAIMABLE_SQL = list(["queued", ...EXECUTING_STATUSES]);

/** Root runs a worker holds, which count against the ceilings. */
export const EXECUTING_ROOT_SQL = (alias: string): string => `${alias}.parent_run_id IS NULL AND ${alias}.status IN (${EXECUTING_SQL})`;

/**
 * Orders every start of a queued root run across processes against the ceilings: a start far
 * from them takes it shared with a slot lock, one near a ceiling exclusively (lockedCountsSql).
 */
export const ADMISSION_LOCK = 7234002;
/** Admission starts that may be in flight side by side, each holding one slot lock (keys START_SLOT_LOCK..+START_SLOTS-1). */
const START_SLOTS = 8;
const START_SLOT_LOCK = 7234100;

/** The agent's own ceiling on concurrent root runs, from its spec `a` (domain agentCeiling). */
export const AGENT_CEILING_SQL = `coalesce(nullif((a.spec ->> 'maxConcurrentRootRuns')::int, 0), ${DEFAULT_MAX_CONCURRENT_ROOT_RUNS})`;

/**
 * The install's ceiling on executing root runs, read inside the statement from the ledger's one
 * settings row (an init plan, evaluated once per statement), so every replica applies the same
 * value with no extra round trip. A missing row means the domain default, never unbounded.
 */
export const INSTALL_CEILING_SQL = `coalesce((SELECT s.root_run_ceiling FROM install_settings s WHERE s.id = 1), ${DEFAULT_INSTALL_MAX_CONCURRENT_ROOT_RUNS})`;

/** Whether run `o` is ahead of run `r` in their conversation's queue (domain aheadInQueue). */
export const AHEAD_SQL = `(coalesce(o.request_received_at, o.created_at), o.created_at, o.id) < (coalesce(r.request_received_at, r.created_at), r.created_at, r.id)`;

/** Where a statement keeps the rule's input from the caller: the clock (the install's ceiling comes from the ledger). */
export interface StartRuleParams<P> {
  readonly now: (params: P) => Date;
}

/**
 * The facts the rule reads about run `r`, as SQL: whether a fresh root run has another run of its
 * conversation in flight or ahead of it, and how many root runs execute, of its agent and in all.
 */
export interface StartFactsSql {
  readonly conversationBusy: string;
  readonly agentExecuting: string;
  readonly allExecuting: string;
}

/** The facts read per run, by subqueries: for one run (a claim's re-check) or a few (a view). */
export const FACTS_PER_RUN: StartFactsSql = {
  conversationBusy: `EXISTS (
      SELECT 1 FROM runs o WHERE o.conversation_id = r.conversation_id AND o.parent_run_id IS NULL AND o.id <> r.id
        AND ((o.started_at IS NOT NULL AND o.status IN (${LIVE_SQL}))
          OR (o.status = 'queued' AND o.started_at IS NULL AND ${AHEAD_SQL})))`,
  agentExecuting: `(SELECT count(*) FROM runs x WHERE x.agent_id = r.agent_id AND ${EXECUTING_ROOT_SQL("x")})`,
  allExecuting: `(SELECT count(*) FROM runs x WHERE ${EXECUTING_ROOT_SQL("x")})`,
};

/**
 * The same facts for every run at once, from the CTEs in FACTS_SET_CTES (a statement includes them
 * and joins `executing e ON e.agent_id = r.agent_id`): a claim's candidate query reads many
 * queued runs, and counting per run there made every claim slower than the rule is worth.
 * A fresh run is behind its conversation when the conversation has a started run in flight, or
 * when it is not the first fresh queued run in its queue.
 */
export const FACTS_SET: StartFactsSql = {
  conversationBusy: `(r.conversation_id IN (SELECT conversation_id FROM busy) OR r.id NOT IN (SELECT id FROM heads))`,
  agentExecuting: "coalesce(e.n, 0)",
  allExecuting: "(SELECT coalesce(sum(n), 0) FROM executing)",
};

export const FACTS_SET_CTES = `executing AS (
    SELECT agent_id, count(*)::int AS n FROM runs x WHERE ${EXECUTING_ROOT_SQL("x")} GROUP BY agent_id),
  busy AS (
    SELECT DISTINCT conversation_id FROM runs WHERE parent_run_id IS NULL AND started_at IS NOT NULL AND status IN (${LIVE_SQL})),
  heads AS (
    SELECT DISTINCT ON (conversation_id) id FROM runs WHERE status = 'queued' AND started_at IS NULL AND parent_run_id IS NULL
    ORDER BY conversation_id, coalesce(request_received_at, created_at), created_at, id)`;

/** The SQL form of startBlocker for run `r` of agent `a`: NULL when it may start, else the wait reason. */
export function startBlockerSql<P>(input: StartRuleParams<P>, facts: StartFactsSql = FACTS_PER_RUN): StatementFragment<P> {
  return fragment<P>`CASE
    WHEN r.paused THEN 'paused'
    WHEN r.not_before > ${input.now}::timestamptz THEN 'coalescing'
    WHEN r.parent_run_id IS NOT NULL THEN NULL
    WHEN r.started_at IS NULL AND ${raw(facts.conversationBusy)} THEN 'conversation_busy'
    WHEN NOT ${ceilingRoomSql<P>(fragment`${raw(facts.agentExecuting)}`, fragment`${raw(facts.allExecuting)}`)} THEN 'concurrency_ceiling'
    END`;
}

/** Room under both ceilings for one more executing root run of agent `a` (domain startBlocker's last test). */
function ceilingRoomSql<P>(agentExecuting: StatementFragment<P>, allExecuting: StatementFragment<P>): StatementFragment<P> {
  return fragment<P>`(${agentExecuting} < ${raw(AGENT_CEILING_SQL)} AND ${allExecuting} < ${raw(INSTALL_CEILING_SQL)})`;
}

/**
 * The call that takes the locks keeping a start's answer true until the commit, and counts
 * executing root runs on a snapshot taken after them (keel_locked_root_run_counts): far from both
 * ceilings, one of START_SLOTS slot locks and the admission lock shared, so up to START_SLOTS starts
 * (admissions and claims alike) commit side by side and each counts the others' room as taken
 * (the margin); near a ceiling, the admission lock exclusively and an exact count. Columns:
 * agent_executing, all_executing, margin. The function names EXECUTING_STATUSES itself, as the
 * index it counts through does (Migration20261227000000), so its count plans once.
 */
function lockedCountsSql<P>(agentId: StatementFragment<P>): StatementFragment<P> {
  return fragment<P>`keel_locked_root_run_counts(${agentId}, ${raw(AGENT_CEILING_SQL)}, ${raw(INSTALL_CEILING_SQL)}, ${raw(String(ADMISSION_LOCK))},
      ${raw(String(START_SLOT_LOCK))}, ${raw(String(START_SLOTS))})`;
}

/**
 * Whether a new root run of agent `a` may start in this transaction, under the start locks
 * (lockedCountsSql). The conversation's part of the rule admission has checked under the
 * conversation's row lock.
 */
export function admissionStartSql<P>(): StatementFragment<P> {
  return fragment<P>`(SELECT ${ceilingRoomSql<P>(fragment`(c.agent_executing + c.margin)`, fragment`(c.all_executing + c.margin)`)}
    FROM ${lockedCountsSql<P>(fragment`a.id`)} c)`;
}

/**
 * A row source `locked` for a claim: the start locks and counts for agent `agentId`'s root run, or
 * no row (no locks) when `lock` is false, as for a child run or a lease-expired reclaim, which the
 * ceilings do not gate. Join it with LEFT JOIN … ON true and test the run with FACTS_LOCKED.
 */
export function claimStartLocksSql<P>(agentId: (params: P) => string, lock: (params: P) => boolean): StatementFragment<P> {
  return fragment<P>`(SELECT c.agent_executing, c.all_executing, c.margin
    FROM agents a, ${lockedCountsSql<P>(fragment`a.id`)} c
    WHERE a.id = ${agentId} AND ${lock}::boolean)`;
}

/**
 * The facts for one run `r` a claim holds (FOR NO KEY UPDATE since its candidate query), with the
 * ceilings' counts from `locked` (claimStartLocksSql). The conversation's part needs no lock of its
 * own: the mailbox changes a conversation's queue only while holding every live run of it
 * (FOR NO KEY UPDATE), and a run ahead in the queue is, on any snapshot, either fresh and queued
 * or started and live, so two claims of one conversation never both see their run as first.
 */
export const FACTS_LOCKED: StartFactsSql = {
  conversationBusy: FACTS_PER_RUN.conversationBusy,
  agentExecuting: "(locked.agent_executing + locked.margin)",
  allExecuting: "(locked.all_executing + locked.margin)",
};

/** The SQL form of mayStart for run `r` of agent `a`. */
export function mayStartSql<P>(input: StartRuleParams<P>, facts: StartFactsSql = FACTS_PER_RUN): StatementFragment<P> {
  return fragment<P>`(r.status = 'queued' AND (${startBlockerSql(input, facts)}) IS NULL)`;
}

