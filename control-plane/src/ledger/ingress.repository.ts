// The mailbox in the ledger: one transaction per message, holding the conversation's row lock
// from the first statement to the commit, so a conversation's messages are decided one at a
// time against what is committed. What a message does is decided by domain/interrupt.ts;
// this file reads the conversation, asks the planner, and writes the plan.
import { randomUUID } from "node:crypto";
import type { AgentSpec } from "../domain/agent.js";
import { FailedPreconditionError, NotFoundError, PermissionDeniedError } from "../domain/errors.js";
import { coalesceUntil, planAdmission, type AdmissionPlan, type ConversationState, type TargetRun } from "../domain/interrupt.js";
import { ZERO_USAGE, type CommitBoundary, type RunStatus } from "../domain/run.js";
import { ackKey } from "../domain/settlement.js";
import type { ClaimedRun } from "../runner/run-store.js";
import { ClaimNotStarted, type ReservedWorker, type WorkerHandoff } from "../runner/worker-pool.js";
import {
  ACK_WORKING_TEXT,
  type Admission,
  type AdmissionAttempt,
  type Continuation,
  type MailboxStore,
} from "../conversation/ingress.js";
import { appendRunEvents, EMISSION_SEQUENCE_LOCK, MAY_START_ROOT_RUN_SQL, stopParkedRun } from "./ledger-writes.js";
import { asDate, preparedRows, rows, type Sql, type SqlTransaction } from "./sql.js";

const LIVE: ReadonlySet<RunStatus> = new Set(["queued", "running", "awaiting_tool", "awaiting_input", "waiting"]);
/** Live statuses in which no worker holds the run: a stop applies at once. */
const PARKED: ReadonlySet<RunStatus> = new Set(["queued", "awaiting_input", "waiting"]);

/** A root run of the conversation as the planner needs it, read under its row lock. */
interface ConversationRun {
  id: string;
  status: RunStatus;
  connector: string;
  started_at: unknown;
  not_before: unknown;
  created_at: unknown;
  request_received_at: unknown;
  commit_boundary: CommitBoundary;
  requested_by_actor_id: string;
  reply_to_message_id: string | null;
  logical_request_id: string | null;
  interruptions: number;
  step_count: number;
  cancel_requested_by_actor_id: string | null;
  continued: boolean;
  actors: string[] | null;
  request_text: string | null;
}

/** The transaction's fixed facts: which agent, which conversation, what time it is. */
interface Mailroom {
  readonly trx: SqlTransaction;
  readonly agent: AgentSpec;
  readonly conversationId: string;
  readonly externalConversationId: string;
  readonly now: Date;
}

/** The message being placed: its row, and how its trigger should read. */
interface Incoming {
  readonly rowId: string;
  readonly externalId: string;
  readonly actorId: string;
  readonly connector: string;
  readonly text: string;
  /** The relation recorded on a trigger that joins or amends (edits say "edit"). */
  readonly relationLabel: "refines" | "edit";
}

const logicalOf = (run: ConversationRun): string => run.logical_request_id ?? run.id;

function toTarget(run: ConversationRun): TargetRun {
  return {
    runId: run.id,
    started: run.started_at !== null,
    notBefore: asDate(run.not_before),
    commitBoundary: run.commit_boundary,
    audience: { requesterId: run.requested_by_actor_id, addressedActorIds: run.actors ?? [] },
    interruptions: Number(run.interruptions),
    requestReceivedAt: asDate(run.request_received_at ?? run.created_at),
  };
}

/**
 * The conversation as follow-ups see it. The target is the request in progress, else the
 * newest one waiting to start; a run already told to stop (superseded or cancelled) is never a
 * target. Continuation consent is only in question when nothing is live and the newest run
 * ended budget_exhausted without having been continued.
 */
function stateOf(runs: readonly ConversationRun[], eligible: (run: ConversationRun) => boolean = () => true) {
  const live = runs.filter((run) => LIVE.has(run.status) && run.cancel_requested_by_actor_id === null && eligible(run));
  const target = live.filter((run) => run.started_at !== null).at(-1) ?? live.filter((run) => run.started_at === null).at(-1);
  const newest = runs.at(-1);
  const exhausted = target === undefined && newest?.status === "budget_exhausted" && !newest.continued ? newest : undefined;
  const state: ConversationState = {
    target: target === undefined ? undefined : toTarget(target),
    exhausted: exhausted === undefined ? undefined : { runId: exhausted.id, requesterId: exhausted.requested_by_actor_id },
  };
  return { state, target, exhausted };
}

/** Live root runs of the conversation and its newest root run, oldest first, locked. */
async function conversationRuns(trx: SqlTransaction, agentId: string, conversationId: string): Promise<ConversationRun[]> {
  return preparedRows<ConversationRun>(
    trx,
    `SELECT r.id, r.status, r.connector, r.started_at, r.not_before, r.created_at, r.request_received_at, r.commit_boundary,
       r.requested_by_actor_id, r.reply_to_message_id, r.logical_request_id, r.interruptions, r.step_count,
       r.cancel_requested_by_actor_id,
       EXISTS (SELECT 1 FROM runs k WHERE k.continuation_of_run_id = r.id) AS continued,
       (SELECT json_agg(DISTINCT a.actor_id) FROM (
          SELECT t.actor_id FROM run_triggers t WHERE t.run_id = r.id AND t.relation <> 'cancels'
          UNION SELECT i.resolved_by_actor_id FROM tool_invocations i
          WHERE i.run_id = r.id AND i.tool_name = 'keel.ask_user.v1' AND i.resolved_by_actor_id IS NOT NULL) a) AS actors,
       (SELECT string_agg(m.text, E'\\n' ORDER BY t.ordinal, t.received_at) FROM run_triggers t JOIN messages m ON m.id = t.message_id
        WHERE t.run_id = r.id AND t.relation <> 'cancels') AS request_text
     FROM runs r
     WHERE r.conversation_id = ? AND r.parent_run_id IS NULL
       AND (r.status IN ('queued', 'running', 'awaiting_tool', 'awaiting_input', 'waiting')
         OR r.id = (SELECT n.id FROM runs n WHERE n.agent_id = ? AND n.conversation_id = ? AND n.parent_run_id IS NULL
                    ORDER BY n.created_at DESC, n.id DESC LIMIT 1))
     ORDER BY r.created_at, r.id
     FOR NO KEY UPDATE OF r`,
    [conversationId, agentId, conversationId],
  );
}

/**
 * Thrown out of a transaction whose plan waits on a model's answer: it rolls back everything,
 * the message included, and the mailbox asks and tries again.
 */
class NeedsAnswer extends Error {
  constructor(readonly attempt: Exclude<AdmissionAttempt<never>, { kind: "done" }>) {
    super(attempt.kind);
  }
}

async function answering<T>(work: () => Promise<AdmissionAttempt<T>>): Promise<AdmissionAttempt<T>> {
  try {
    return await work();
  } catch (error) {
    if (error instanceof NeedsAnswer) return error.attempt;
    throw error;
  }
}

export interface IngressRepositoryOptions {
  /** Idle workers of this process, to hand a run admission can start at once; none means always queue and notify. */
  readonly handoff?: WorkerHandoff;
  /** The install's ceiling on concurrent root runs, as claimNext applies it. */
  readonly maxConcurrentRootRuns?: number;
}

/** Used when the composition root passes no install ceiling, as the run repository does. */
const DEFAULT_INSTALL_CEILING = 64;

export function createIngressRepository(sql: Sql, options: IngressRepositoryOptions = {}): MailboxStore {
  const installCeiling = options.maxConcurrentRootRuns ?? DEFAULT_INSTALL_CEILING;
  /** Agents whose last start in this process was refused by a ceiling (see admit). */
  const atCeiling = new Set<string>();
  return {
    admit: async (message, answers, now) => {
      // A worker reserved for the new run, until it is handed the run (then it is the run's and
      // lets go of it itself). Once handed, its first model call goes ahead and everything else
      // it does waits for `committing` (see ReservedWorker.start).
      let reserved: ReservedWorker | undefined;
      let committing: { resolve: () => void; reject: (error: unknown) => void } | undefined;
      let attempt: AdmissionAttempt<Admission>;
      try {
        attempt = await answering(() => sql.transaction(async (trx): Promise<AdmissionAttempt<Admission>> => {
          const [stored] = await preparedRows<{
            spec: AgentSpec | null;
            conversation_id: string | null;
            message_row_id: string | null;
            existing_run_id: string | null;
            existing_status: RunStatus | null;
          }>(
            trx,
            // The agent, the actor, the conversation (whose row lock serializes its messages) and
            // the message, idempotent on the connector's message id.
            `WITH agent AS (SELECT spec FROM agents WHERE id = ?),
             actor AS (
               INSERT INTO actors (id, display_name) SELECT ?, ? FROM agent
               ON CONFLICT (id) DO UPDATE SET display_name = EXCLUDED.display_name
               WHERE EXCLUDED.display_name <> '' AND actors.display_name <> EXCLUDED.display_name),
             conversation AS (
               INSERT INTO conversations (id, agent_id, external_id, connector) SELECT ?, ?, ?, ? FROM agent
               ON CONFLICT (agent_id, external_id) DO UPDATE SET connector = conversations.connector
               RETURNING id),
             message AS (
               INSERT INTO messages (id, conversation_id, external_id, actor_id, text, reply_to_external_id)
               SELECT ?, conversation.id, ?, ?, ?, ? FROM conversation
               ON CONFLICT (conversation_id, external_id) DO NOTHING RETURNING id)
             SELECT (SELECT spec FROM agent) AS spec, (SELECT id FROM conversation) AS conversation_id,
               (SELECT id FROM message) AS message_row_id,
               (SELECT m.run_id FROM messages m JOIN conversation c ON m.conversation_id = c.id WHERE m.external_id = ?) AS existing_run_id,
               (SELECT r.status FROM messages m JOIN conversation c ON m.conversation_id = c.id JOIN runs r ON r.id = m.run_id
                WHERE m.external_id = ?) AS existing_status`,
            [
              message.agentId,
              message.actorId,
              message.actorDisplayName,
              randomUUID(),
              message.agentId,
              message.conversationId,
              message.connector,
              randomUUID(),
              message.messageId,
              message.actorId,
              message.text,
              message.replyToMessageId ?? null,
              message.messageId,
              message.messageId,
            ],
          );
          if (stored?.spec === null || stored?.spec === undefined) throw new NotFoundError("agent", message.agentId);
          if (stored.message_row_id === null) {
            if (stored.existing_run_id === null || stored.existing_status === null) {
              // Another transaction stored this message id a moment ago; its outcome is not visible
              // to this statement. Fail this attempt: the retry sees it as a duplicate.
              throw new ConcurrentMessageError(message.messageId);
            }
            return { kind: "done", result: { runId: stored.existing_run_id, status: stored.existing_status, duplicate: true } };
          }
          const room: Mailroom = {
            trx,
            agent: stored.spec,
            conversationId: stored.conversation_id!,
            externalConversationId: message.conversationId,
            now,
          };
          const incoming: Incoming = {
            rowId: stored.message_row_id,
            externalId: message.messageId,
            actorId: message.actorId,
            connector: message.connector,
            text: message.text,
            relationLabel: "refines",
          };
          const runs = await conversationRuns(trx, room.agent.id, room.conversationId);
          const { state, target } = stateOf(runs);
          const plan = planAdmission({
            state,
            actorId: message.actorId,
            scope: room.agent.interrupt.scope,
            settings: room.agent.interrupt,
            now,
            ...(answers.relation !== undefined && answers.relation.runId === state.target?.runId ? { relation: answers.relation.relation } : {}),
            ...(answers.consent !== undefined && answers.consent.runId === state.exhausted?.runId ? { consent: answers.consent.answer } : {}),
          });
          if (plan.kind === "needs_relation") {
            throw new NeedsAnswer({ kind: "needs_relation", agent: room.agent, runId: plan.runId, request: target?.request_text ?? "" });
          }
          if (plan.kind === "needs_consent") throw new NeedsAnswer({ kind: "needs_consent", agent: room.agent, runId: plan.runId });
          const note = answers.relation?.note ?? answers.consent?.note;
          if (plan.kind === "new_request" && options.handoff !== undefined && startsAtOnce(room, runs)) {
            reserved = options.handoff.reserve();
            if (reserved !== undefined) {
              const worker = reserved;
              const why = note === undefined ? plan.why : `${plan.why} (${note})`;
              // The worker starts now, before the claim is even written: its first model call
              // (replayable inference, nothing written) overlaps the insert and the COMMIT. If
              // a ceiling leaves the run queued instead, or the transaction fails, the call is
              // aborted and the worker goes back to claiming. An agent whose last start here met
              // a ceiling is not started early until a start succeeds again, so an agent at its
              // ceiling does not send the provider a call to abort for every message.
              const runId = randomUUID();
              const early = !atCeiling.has(room.agent.id);
              const handOver = (claimed: ClaimedRun) => {
                const committed = new Promise<void>((resolve, reject) => (committing = { resolve, reject }));
                committed.catch(() => {}); // the worker sees a failure when it waits; here it is only reported
                worker.start(claimed, committed);
                reserved = undefined; // the worker is the run's now: it lets go of it itself
              };
              if (early) handOver(freshClaim(room, incoming, runId));
              const started = await newRequest(room, incoming, why, { workerId: worker.workerId, leaseMs: worker.leaseMs, installCeiling }, runId);
              if (started.claimed === undefined) {
                atCeiling.add(room.agent.id);
                committing?.reject(new ClaimNotStarted(runId));
                committing = undefined;
              } else {
                atCeiling.delete(room.agent.id);
                if (!early) handOver(started.claimed);
              }
              return { kind: "done", result: started.admission };
            }
          }
          const admission = await applyPlan(room, plan, incoming, runs, note);
          return { kind: "done", result: admission };
        }));
      } catch (error) {
        committing?.reject(error);
        reserved?.release();
        throw error;
      }
      // Committed: the worker's run is durable (or, if a ceiling said wait, the run was queued
      // and announced, and a worker started on it early has already been told to let it go).
      committing?.resolve();
      reserved?.release();
      return attempt;
    },

    edit: (edit, now) =>
      sql.transaction(async (trx): Promise<Admission> => {
        const [conversation] = await rows<{ id: string; spec: AgentSpec }>(
          trx,
          `SELECT c.id, a.spec FROM conversations c JOIN agents a ON a.id = c.agent_id
           WHERE c.agent_id = ? AND c.external_id = ? FOR NO KEY UPDATE OF c`,
          [edit.agentId, edit.conversationId],
        );
        if (conversation === undefined) throw new NotFoundError("message", edit.messageId);
        const [original] = await rows<{ id: string; actor_id: string; run_id: string | null; latest_text: string; edits: number; connector: string }>(
          trx,
          `SELECT m.id, m.actor_id, m.run_id, c.connector,
             coalesce((SELECT e.text FROM messages e WHERE e.edit_of_message_id = m.id ORDER BY e.created_at DESC, e.external_id DESC LIMIT 1), m.text) AS latest_text,
             (SELECT count(*)::int FROM messages e WHERE e.edit_of_message_id = m.id) AS edits
           FROM messages m JOIN conversations c ON c.id = m.conversation_id
           WHERE m.conversation_id = ? AND m.external_id = ? AND m.edit_of_message_id IS NULL`,
          [conversation.id, edit.messageId],
        );
        if (original === undefined) throw new NotFoundError("message", edit.messageId);
        if (original.actor_id !== edit.actorId) {
          throw new PermissionDeniedError(`actor: ${edit.actorId} may not edit message ${edit.messageId}, which ${original.actor_id} wrote`);
        }
        const current = async (runId: string | null): Promise<Admission> => {
          if (runId === null) throw new FailedPreconditionError(`message ${edit.messageId} belongs to no run`);
          const [run] = await rows<{ status: RunStatus }>(trx, "SELECT status FROM runs WHERE id = ?", [runId]);
          return { runId, status: run!.status, duplicate: true };
        };
        // An edit that changes nothing (a retried call) is a no-op.
        if (original.latest_text === edit.text) {
          const [latest] = await rows<{ run_id: string | null }>(
            trx,
            "SELECT run_id FROM messages WHERE id = ? OR edit_of_message_id = ? ORDER BY created_at DESC LIMIT 1",
            [original.id, original.id],
          );
          return current(latest?.run_id ?? original.run_id);
        }
        // The edit is a message of its own, so the original and every version stay in the ledger.
        const editRowId = randomUUID();
        await trx.query(
          `INSERT INTO messages (id, conversation_id, external_id, actor_id, text, edit_of_message_id) VALUES (?, ?, ?, ?, ?, ?)`,
          [editRowId, conversation.id, `${edit.messageId}#edit-${original.edits + 1}`, edit.actorId, edit.text, original.id],
        );
        await trx.query("UPDATE messages SET edited_at = ? WHERE id = ?", [now, original.id]);

        const room: Mailroom = { trx, agent: conversation.spec, conversationId: conversation.id, externalConversationId: edit.conversationId, now };
        const incoming: Incoming = {
          rowId: editRowId,
          externalId: `${edit.messageId}#edit-${original.edits + 1}`,
          actorId: edit.actorId,
          connector: original.connector,
          text: edit.text,
          relationLabel: "edit",
        };
        const runs = await conversationRuns(trx, room.agent.id, room.conversationId);
        const carrying = new Set(
          (
            await rows<{ run_id: string }>(
              trx,
              `SELECT DISTINCT t.run_id FROM run_triggers t JOIN messages m ON m.id = t.message_id
               WHERE m.id = ? OR m.edit_of_message_id = ?`,
              [original.id, original.id],
            )
          ).map((row) => row.run_id),
        );
        const { state } = stateOf(runs, (run) => carrying.has(run.id));
        if (state.target === undefined) {
          // Nothing in flight carries the message: the edit is recorded against the run that answered it.
          const runId = original.run_id;
          await trx.query("UPDATE messages SET run_id = ? WHERE id = ?", [runId, editRowId]);
          if (runId !== null) {
            await appendRunEvents(trx, runId, [{ kind: "trigger_added", summary: `message ${edit.messageId} edited by ${edit.actorId} after the run ended; nothing restarted` }]);
          }
          return current(runId);
        }
        // An edit is a refinement by definition: the same policy, without asking a model.
        const plan = planAdmission({
          state: { target: state.target, exhausted: undefined },
          actorId: edit.actorId,
          scope: room.agent.interrupt.scope,
          settings: room.agent.interrupt,
          now,
          relation: "refines",
        });
        return applyPlan(room, plan, incoming, runs, `edit of message ${edit.messageId}`);
      }),

    continueRun: (request, answers, now) =>
      answering(() => sql.transaction(async (trx): Promise<AdmissionAttempt<Continuation>> => {
        const [run] = await rows<ConversationRun & { agent_spec: AgentSpec; conversation_id: string; external_id: string; parent_run_id: string | null }>(
          trx,
          `SELECT r.*, c.external_id, a.spec AS agent_spec,
             EXISTS (SELECT 1 FROM runs k WHERE k.continuation_of_run_id = r.id) AS continued
           FROM runs r JOIN conversations c ON c.id = r.conversation_id JOIN agents a ON a.id = r.agent_id
           WHERE r.id = ? FOR NO KEY UPDATE OF r`,
          [request.runId],
        );
        if (run === undefined) throw new NotFoundError("run", request.runId);
        if (run.status !== "budget_exhausted" || run.parent_run_id !== null) {
          throw new FailedPreconditionError(`run ${request.runId} is ${run.status}; only a root run that ran out of budget can be continued`);
        }
        const [existing] = await rows<{ id: string; external_message_id: string | null }>(
          trx,
          `SELECT k.id, (SELECT t.external_message_id FROM run_triggers t WHERE t.run_id = k.id AND t.relation = 'continues' LIMIT 1) AS external_message_id
           FROM runs k WHERE k.continuation_of_run_id = ?`,
          [request.runId],
        );
        if (existing !== undefined) {
          if (request.messageId !== undefined && existing.external_message_id === request.messageId) {
            return { kind: "done", result: { runId: existing.id, authorized: true } };
          }
          throw new FailedPreconditionError(`run ${request.runId} was already continued as run ${existing.id}; one yes authorizes one run`);
        }
        if (request.actorId !== run.requested_by_actor_id) {
          await appendRunEvents(trx, run.id, [
            { kind: "trigger_added", summary: `${request.actorId} asked to continue, but only the requester ${run.requested_by_actor_id} may; nothing authorized` },
          ]);
          return { kind: "done", result: { runId: run.id, authorized: false } };
        }
        const consent = answers.consent?.runId === run.id ? answers.consent : undefined;
        if (consent === undefined) throw new NeedsAnswer({ kind: "needs_consent", agent: run.agent_spec, runId: run.id });
        if (consent.answer !== "yes") {
          await appendRunEvents(trx, run.id, [
            { kind: "trigger_added", summary: `continuation not authorized: ${request.actorId} answered ${consent.answer}${consent.note === undefined ? "" : ` (${consent.note})`}` },
          ]);
          return { kind: "done", result: { runId: run.id, authorized: false } };
        }
        await trx.query("INSERT INTO actors (id) VALUES (?) ON CONFLICT (id) DO NOTHING", [request.actorId]);
        const externalId = request.messageId ?? `continue-${randomUUID()}`;
        const [message] = await rows<{ id: string }>(
          trx,
          `INSERT INTO messages (id, conversation_id, external_id, actor_id, text) VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (conversation_id, external_id) DO UPDATE SET external_id = messages.external_id RETURNING id`,
          [randomUUID(), run.conversation_id, externalId, request.actorId, request.text],
        );
        const room: Mailroom = { trx, agent: run.agent_spec, conversationId: run.conversation_id, externalConversationId: run.external_id, now };
        const admission = await continueExhausted(
          room,
          run,
          { rowId: message!.id, externalId, actorId: request.actorId, connector: run.connector, text: request.text, relationLabel: "refines" },
          "authorized through ContinueRun",
        );
        return { kind: "done", result: { runId: admission.runId, authorized: true } };
      })),
  };
}

/** A message id two transactions stored at once; the mailbox retries and finds the duplicate. */
export class ConcurrentMessageError extends Error {
  override readonly name = "ConcurrentMessageError";
  constructor(messageId: string) {
    super(`message ${messageId} was stored concurrently`);
  }
}

async function applyPlan(room: Mailroom, plan: AdmissionPlan, incoming: Incoming, runs: readonly ConversationRun[], note: string | undefined): Promise<Admission> {
  const why = note === undefined ? ("why" in plan ? plan.why : "") : `${"why" in plan ? plan.why : ""} (${note})`;
  const byId = (id: string): ConversationRun => {
    const run = runs.find((r) => r.id === id);
    if (run === undefined) throw new Error(`run ${id} is not in the conversation it was planned against`);
    return run;
  };
  let admission: Admission;
  switch (plan.kind) {
    case "new_request":
      admission = (await newRequest(room, incoming, why)).admission;
      break;
    case "join":
      admission = await addTrigger(room, byId(plan.runId), incoming, { relation: incoming.relationLabel === "edit" ? "edit" : plan.coalesced ? "coalesced" : "refines", notBefore: plan.notBefore, amends: false }, why);
      break;
    case "amend":
      admission = await addTrigger(room, byId(plan.runId), incoming, { relation: incoming.relationLabel === "edit" ? "edit" : "amends", notBefore: undefined, amends: true }, why);
      break;
    case "supersede":
      admission = await supersede(room, byId(plan.runId), incoming, why);
      break;
    case "cancel":
      admission = await cancelByMessage(room, byId(plan.runId), incoming, why);
      break;
    case "continue":
      admission = await continueExhausted(room, byId(plan.exhaustedRunId), incoming, why);
      break;
    case "record": {
      const run = byId(plan.runId);
      await room.trx.query("UPDATE messages SET run_id = ? WHERE id = ?", [run.id, incoming.rowId]);
      await appendRunEvents(room.trx, run.id, [{ kind: "trigger_added", summary: `message ${incoming.externalId} from ${incoming.actorId}: ${why}` }]);
      admission = { runId: run.id, status: run.status, duplicate: false };
      break;
    }
    case "needs_relation":
    case "needs_consent":
      throw new Error(`plan ${plan.kind} cannot be applied`);
  }
  // A worker may have skipped a run this transaction held locked; let one look again. (A new
  // run's insert has already said so.)
  if (plan.kind !== "new_request" && plan.kind !== "supersede" && plan.kind !== "continue") {
    await room.trx.query("SELECT pg_notify('keel_runs', ?)", [admission.runId]);
  }
  return admission;
}

/** Claiming a new run in the transaction that admits it, for a reserved worker. */
interface StartClaim {
  readonly workerId: string;
  readonly leaseMs: number;
  readonly installCeiling: number;
}

/**
 * Whether a new request in this conversation may start the moment it commits: its coalesce
 * window is zero, and no root run of the conversation is live, so it is the head of the
 * conversation's queue and nothing is in flight. The conversation's row lock, held since the
 * first statement, keeps it that way until the commit; the ceilings are checked under the
 * admission lock in insertRun.
 */
function startsAtOnce(room: Mailroom, runs: readonly ConversationRun[]): boolean {
  return runs.every((run) => !LIVE.has(run.status)) && coalesceUntil(room.agent.interrupt, room.now, room.now).getTime() <= room.now.getTime();
}

interface NewRun {
  readonly runId: string;
  readonly connector: string;
  readonly requesterId: string;
  readonly replyToMessageId: string;
  readonly logicalRequestId: string;
  readonly requestReceivedAt: Date;
  readonly interruptions: number;
  readonly inheritsFromRunId?: string;
  readonly continuationOfRunId?: string;
  /** Triggers carried over from this run, shown with the inherited work. */
  readonly carryTriggersOf?: string;
  /** Whether the carried messages now belong to the new run (a successor), or stay (a continuation). */
  readonly moveCarriedMessages?: boolean;
  readonly trigger: { readonly incoming: Incoming; readonly relation: string };
  readonly summary: string;
  /** A new logical request's hourglass, on the message that started it; a successor has none of its own. */
  readonly ack?: { readonly messageId: string; readonly actorId: string };
  /** Claim the run for this worker in the same statement when the ceilings allow. */
  readonly claim?: StartClaim;
}

/**
 * Inserts a root run with its triggers, its first event and, for a new logical request, its
 * working ack, in one statement. With a claim, and room under both ceilings (MAY_START_ROOT_RUN_SQL
 * takes the locks and counts as claimNext counts), the run is inserted running, leased to the
 * reserved worker at epoch 1; otherwise it is queued and a worker is woken. The ack's insert draws its seq only after the emission-order lock is held in
 * shared mode (it selects from the lock), as reserveEmissions does. Returns whether the run was claimed.
 */
async function insertRun(room: Mailroom, run: NewRun): Promise<boolean> {
  const notBefore = coalesceUntil(room.agent.interrupt, run.requestReceivedAt, room.now);
  const carry = run.carryTriggersOf ?? null;
  const ack = run.ack;
  const claim = run.claim;
  const [inserted] = await preparedRows<{ started: boolean }>(
    room.trx,
    `WITH start AS (
       SELECT CASE WHEN ?::boolean THEN ${MAY_START_ROOT_RUN_SQL} ELSE false END AS go
       FROM agents a WHERE a.id = ?),
     carried AS (
       INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
       SELECT ?::uuid, t.message_id, t.actor_id, t.external_message_id, t.received_at, t.relation, 0, true,
         row_number() OVER (ORDER BY t.ordinal, t.received_at)
       FROM run_triggers t WHERE t.run_id = ?::uuid AND t.relation <> 'cancels'
       RETURNING message_id),
     counted AS (SELECT count(*)::int AS n FROM carried),
     new_run AS (
       INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, reply_to_message_id, budget, usage,
         logical_request_id, request_received_at, interruptions, inherits_from_run_id, continuation_of_run_id, not_before,
         trigger_count, event_seq, lease_owner, lease_epoch, lease_expires_at, started_at)
       SELECT ?, ?, ?, ?, CASE WHEN start.go THEN 'running' ELSE 'queued' END, ?, ?, ?::jsonb, ?::jsonb, ?, ?, ?, ?, ?, ?, counted.n + 1,
         CASE WHEN start.go THEN 2 ELSE 1 END, CASE WHEN start.go THEN ?::text END, CASE WHEN start.go THEN 1 ELSE 0 END,
         CASE WHEN start.go THEN now() + make_interval(secs => ?::int / 1000.0) END, CASE WHEN start.go THEN ?::timestamptz END
       FROM counted, start),
     own AS (
       INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
       SELECT ?, ?, ?, ?, ?, ?, 0, false, counted.n + 1 FROM counted),
     moved AS (
       UPDATE messages SET run_id = ? WHERE id = ? OR (? AND id IN (SELECT message_id FROM carried))),
     event AS (
       INSERT INTO run_events (run_id, seq, kind, status, summary)
       SELECT ?::uuid, 1, 'created', 'queued', ?
       UNION ALL SELECT ?::uuid, 2, 'status_changed', 'running', 'claimed by ' || ? || ' at epoch 1' FROM start WHERE start.go),
     ack_lock AS (SELECT pg_advisory_xact_lock_shared(${EMISSION_SEQUENCE_LOCK}) AS held WHERE ?::boolean),
     ack AS (
       INSERT INTO emissions (id, idempotency_key, connector, kind, run_id, agent_id, conversation_id, external_conversation_id,
         reply_to_message_id, text, ack_state, addressed_actor_ids)
       SELECT ?::uuid, ?, ?, 'ack', ?::uuid, ?, ?::uuid, ?, ?, ?, 'working', ?::jsonb FROM ack_lock
       ON CONFLICT (idempotency_key) DO NOTHING
       RETURNING id)
     SELECT start.go AS started, pg_notify('keel_run_events', ?),
       (SELECT pg_notify('keel_runs', ?) WHERE NOT start.go) AS queued,
       (SELECT pg_notify('keel_emissions', ?) FROM ack) AS acked
     FROM start`,
    [
      claim !== undefined,
      claim?.installCeiling ?? 0,
      room.agent.id,
      run.runId,
      carry,
      run.runId,
      room.agent.id,
      room.conversationId,
      run.connector,
      run.requesterId,
      run.replyToMessageId,
      JSON.stringify(room.agent.budget),
      JSON.stringify(ZERO_USAGE),
      run.logicalRequestId,
      run.requestReceivedAt,
      run.interruptions,
      run.inheritsFromRunId ?? null,
      run.continuationOfRunId ?? null,
      notBefore,
      claim?.workerId ?? null,
      claim?.leaseMs ?? 0,
      room.now,
      run.runId,
      run.trigger.incoming.rowId,
      run.trigger.incoming.actorId,
      run.trigger.incoming.externalId,
      room.now,
      run.trigger.relation,
      run.runId,
      run.trigger.incoming.rowId,
      run.moveCarriedMessages === true,
      run.runId,
      run.summary,
      run.runId,
      claim?.workerId ?? "",
      ack !== undefined,
      randomUUID(),
      ackKey(run.logicalRequestId, "working"),
      run.connector,
      run.runId,
      room.agent.id,
      room.conversationId,
      room.externalConversationId,
      ack?.messageId ?? null,
      ACK_WORKING_TEXT,
      JSON.stringify(ack === undefined ? [] : [ack.actorId]),
      run.runId,
      run.runId,
      run.connector,
    ],
  );
  if (inserted === undefined) throw new Error(`agent ${room.agent.id} vanished while admitting run ${run.runId}`);
  return claim !== undefined && inserted.started;
}

/**
 * A request of its own: a fresh logical request, acked on its message. With a claim, the run is
 * started for the reserved worker when the ceilings allow; what the worker needs is all known here
 * (a fresh run has one trigger, no steps and nothing inherited), so it starts without a read.
 */
async function newRequest(
  room: Mailroom,
  incoming: Incoming,
  why: string,
  claim?: StartClaim,
  runId: string = randomUUID(),
): Promise<{ admission: Admission; claimed: ClaimedRun | undefined }> {
  const relation = relationOf(incoming);
  const started = await insertRun(room, {
    runId,
    connector: incoming.connector,
    requesterId: incoming.actorId,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    requestReceivedAt: room.now,
    interruptions: 0,
    trigger: { incoming, relation },
    summary: `message ${incoming.externalId} from ${incoming.actorId}: ${why}`,
    ack: { messageId: incoming.externalId, actorId: incoming.actorId },
    ...(claim === undefined ? {} : { claim }),
  });
  // A connector is told the run was admitted (queued) whether or not an idle worker took it in
  // the same commit: what it sees does not depend on this process's idle workers.
  const admission: Admission = { runId, status: "queued", duplicate: false };
  if (!started || claim === undefined) return { admission, claimed: undefined };
  return { admission, claimed: freshClaim(room, incoming, runId) };
}

const relationOf = (incoming: Incoming): "edit" | "initial" => (incoming.relationLabel === "edit" ? "edit" : "initial");

/**
 * The run newRequest starts for a worker, as the worker gets it: everything is known before the
 * run is written (a fresh run has one trigger, no steps and nothing inherited).
 */
function freshClaim(room: Mailroom, incoming: Incoming, runId: string): ClaimedRun {
  return {
    runId,
    epoch: 1,
    agent: room.agent,
    connector: incoming.connector,
    status: "queued",
    stepCount: 0,
    usage: ZERO_USAGE,
    startedAt: room.now,
    cancelRequestedByActorId: undefined,
    supersededByRunId: undefined,
    messages: [{ messageId: incoming.externalId, actorId: incoming.actorId, text: incoming.text, relation: relationOf(incoming), afterStep: 0, inherited: false }],
    triggerCount: 1,
    requestedByActorId: incoming.actorId,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    commitBoundary: "buffering",
    inheritsFromRunId: undefined,
  };
}

/** Joins a pending run (coalescing) or amends a running one at its next step boundary. */
async function addTrigger(
  room: Mailroom,
  run: ConversationRun,
  incoming: Incoming,
  how: { relation: string; notBefore: Date | undefined; amends: boolean },
  why: string,
): Promise<Admission> {
  await room.trx.query(
    `WITH trigger AS (
       INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
       SELECT r.id, ?, ?, ?, ?, ?, CASE WHEN ? THEN r.step_count ELSE 0 END, false, r.trigger_count + 1 FROM runs r WHERE r.id = ?)
     UPDATE runs SET trigger_count = trigger_count + 1, interruptions = interruptions + ?,
       not_before = coalesce(?, not_before), updated_at = now()
     WHERE id = ?`,
    [incoming.rowId, incoming.actorId, incoming.externalId, room.now, how.relation, how.amends, run.id, how.amends ? 1 : 0, how.notBefore ?? null, run.id],
  );
  await room.trx.query("UPDATE messages SET run_id = ? WHERE id = ?", [run.id, incoming.rowId]);
  await appendRunEvents(room.trx, run.id, [
    { kind: "trigger_added", summary: `message ${incoming.externalId} from ${incoming.actorId} ${how.amends ? "amends the run at its next step" : "joins the run"}: ${why}` },
  ]);
  return { runId: run.id, status: run.status, duplicate: false };
}

/**
 * The run stops at its next safe point (at once, if no worker holds it) and a successor takes
 * over the same logical request: every trigger so far, the new message, the completed work it
 * inherits, and the request's ack, which is already on the first message and is not repeated.
 */
async function supersede(room: Mailroom, run: ConversationRun, incoming: Incoming, why: string): Promise<Admission> {
  const successorId = randomUUID();
  const logical = logicalOf(run);
  await insertRun(room, {
    runId: successorId,
    connector: run.connector,
    requesterId: run.requested_by_actor_id,
    replyToMessageId: run.reply_to_message_id ?? incoming.externalId,
    logicalRequestId: logical,
    requestReceivedAt: asDate(run.request_received_at ?? run.created_at),
    interruptions: Number(run.interruptions) + 1,
    inheritsFromRunId: run.id,
    carryTriggersOf: run.id,
    moveCarriedMessages: true,
    trigger: { incoming, relation: incoming.relationLabel },
    summary: `supersedes run ${run.id}: message ${incoming.externalId} from ${incoming.actorId}: ${why}`,
  });
  const reason = `superseded by run ${successorId} after message ${incoming.externalId} from ${incoming.actorId}`;
  if (PARKED.has(run.status)) {
    await stopParkedRun(room.trx, {
      ...emissionTarget(room, run),
      replyToMessageId: run.reply_to_message_id,
      logicalRequestId: logical,
      commitBoundary: run.commit_boundary,
      addressedActorIds: run.actors ?? [run.requested_by_actor_id],
      actorId: incoming.actorId,
      reason,
      supersededBy: successorId,
    });
  } else {
    await room.trx.query(
      `UPDATE runs SET superseded_by_run_id = ?, cancel_requested_by_actor_id = ?, cancel_reason = ?, updated_at = now() WHERE id = ?`,
      [successorId, incoming.actorId, reason, run.id],
    );
    await appendRunEvents(room.trx, run.id, [{ kind: "status_changed", status: run.status, summary: `${reason}; stops at its next safe point` }]);
  }
  return { runId: successorId, status: "queued", duplicate: false };
}

/** "never mind, stop": the message is recorded on the run it stops. */
async function cancelByMessage(room: Mailroom, run: ConversationRun, incoming: Incoming, why: string): Promise<Admission> {
  await room.trx.query(
    `WITH trigger AS (
       INSERT INTO run_triggers (run_id, message_id, actor_id, external_message_id, received_at, relation, after_step, inherited, ordinal)
       SELECT r.id, ?, ?, ?, ?, 'cancels', r.step_count, false, r.trigger_count + 1 FROM runs r WHERE r.id = ?)
     UPDATE runs SET cancel_requested_by_actor_id = ?, cancel_reason = ?, trigger_count = trigger_count + 1, updated_at = now() WHERE id = ?`,
    [incoming.rowId, incoming.actorId, incoming.externalId, room.now, run.id, incoming.actorId, `message ${incoming.externalId}: ${why}`, run.id],
  );
  await room.trx.query("UPDATE messages SET run_id = ? WHERE id = ?", [run.id, incoming.rowId]);
  if (PARKED.has(run.status)) {
    await stopParkedRun(room.trx, {
      ...emissionTarget(room, run),
      replyToMessageId: run.reply_to_message_id,
      logicalRequestId: logicalOf(run),
      commitBoundary: run.commit_boundary,
      addressedActorIds: [...new Set([...(run.actors ?? [run.requested_by_actor_id]), incoming.actorId])],
      actorId: incoming.actorId,
      reason: `message ${incoming.externalId}: ${why}`,
    });
    return { runId: run.id, status: "cancelled", duplicate: false };
  }
  await appendRunEvents(room.trx, run.id, [
    { kind: "status_changed", status: run.status, summary: `cancellation requested by ${incoming.actorId} (message ${incoming.externalId}): ${why}` },
  ]);
  return { runId: run.id, status: run.status, duplicate: false };
}

/**
 * One fresh, bounded run with the exhausted run's task context: its triggers and the work it
 * completed, then the requester's yes. The unique index on continuation_of_run_id makes a
 * second continuation of the same run impossible.
 */
async function continueExhausted(room: Mailroom, run: ConversationRun, incoming: Incoming, why: string): Promise<Admission> {
  const runId = randomUUID();
  await insertRun(room, {
    runId,
    connector: run.connector,
    requesterId: run.requested_by_actor_id,
    replyToMessageId: incoming.externalId,
    logicalRequestId: runId,
    requestReceivedAt: room.now,
    interruptions: 0,
    inheritsFromRunId: run.id,
    continuationOfRunId: run.id,
    carryTriggersOf: run.id,
    trigger: { incoming, relation: "continues" },
    summary: `continues run ${run.id}, authorized by ${incoming.actorId} (message ${incoming.externalId}): ${why}`,
    ack: { messageId: incoming.externalId, actorId: incoming.actorId },
  });
  await appendRunEvents(room.trx, run.id, [{ kind: "trigger_added", summary: `continued as run ${runId}: ${incoming.actorId} authorized one fresh run` }]);
  return { runId, status: "queued", duplicate: false };
}

function emissionTarget(room: Mailroom, run: ConversationRun) {
  return { runId: run.id, agentId: room.agent.id, conversationId: room.conversationId, externalConversationId: room.externalConversationId, connector: run.connector };
}
