// The crash matrix: for each crash point, N runs of a four-step agent (read, read, write,
// reply) go through a Keel process that SIGKILLs itself at that point once per run
// (test/support/fault-serve.ts), restarted whenever it dies. Afterwards the ledger and the
// write tool's effects file must show: no committed step lost or duplicated, no write run
// twice, reads interrupted and asked again, writes with an unknown outcome left to an
// operator (never replayed), every run finished with exactly one reply.
import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { ResolvedOutcome } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec } from "../control-plane/src/domain/agent.js";
import { killAllChildren, prepareLedger, sleep, startFaultServe, type ServerProcess } from "./support/child-processes.js";
import { connectClient } from "./support/clients.js";
import { createTestDatabase } from "./support/keel-fixture.js";
import { scriptedAgent, scriptedModel, scriptedTurn as turn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { writesRecorded } from "./support/test-tools.js";


const RUNS = Number(process.env["KEEL_CRASH_RUNS"] ?? 20);
/** Wall-clock budget per crash point (submission, crash loop, resolution, settling). */
const POINT_BUDGET_MS = Number(process.env["KEEL_CRASH_POINT_BUDGET_MS"] ?? 110_000);
const MAX_STARTS = 4 * RUNS + 4;
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "budget_exhausted"]);

type FaultPoint = "after_model_call" | "after_intent" | "during_read" | "during_write" | "after_tool_result";
const POINTS: readonly FaultPoint[] = ["after_model_call", "after_intent", "during_read", "during_write", "after_tool_result"];


/** Turn N plays on the run's N-th committed model call: read, read, write, reply. */
function matrixAgent(id: string): AgentSpec {
  const turns = [
    turn("", [toolCall("test.echo.v1", { text: "a" })]),
    turn("", [toolCall("test.echo.v1", { text: "b" })]),
    turn("", [toolCall("test.append_line.v1", { key: "w" })]),
    turn("done"),
  ];
  return scriptedAgent(id, turns, { displayName: "crash matrix agent", tools: toolGrants(["test.echo.v1", "test.append_line.v1"]) });
}

/** Keeps one fault-serve process up: restarts it whenever it has died, up to a cap. */
class Supervisor {
  current: ServerProcess | undefined;
  starts = 0;
  readonly deaths: string[] = [];
  /** Lines from any child that should never appear: runner errors, a fault that could not wait for quiet. */
  readonly alarms: string[] = [];
  constructor(private readonly env: Record<string, string>) {}

  async ensure(): Promise<ServerProcess> {
    if (this.current?.alive()) return this.current;
    if (this.current !== undefined) {
      this.deaths.push(`exit ${String(this.current.process.exitCode)} signal ${String(this.current.process.signalCode)}`);
      this.collectAlarms(this.current);
      if (this.current.process.signalCode !== "SIGKILL") {
        throw new Error(`fault-serve died without being killed:\n${this.current.output.join("\n")}`);
      }
    }
    if (this.starts >= MAX_STARTS) throw new Error(`fault-serve was started ${this.starts} times; giving up`);
    this.starts += 1;
    this.current = await startFaultServe(this.env, 200);
    return this.current;
  }

  async stop(): Promise<void> {
    if (this.current === undefined) return;
    await this.current.kill();
    this.collectAlarms(this.current);
  }

  private readonly collected = new WeakSet<ServerProcess>();
  private collectAlarms(child: ServerProcess): void {
    if (this.collected.has(child)) return;
    this.collected.add(child);
    for (const line of child.output) {
      if (line.startsWith("FAULT_QUIESCE_TIMEOUT") || /"level":(50|60)/.test(line)) this.alarms.push(line);
    }
  }
}

// ---- ledger helpers ----------------------------------------------------------------------

async function statuses(db: pg.Client, runIds: readonly string[]): Promise<Map<string, string>> {
  const { rows } = await db.query<{ id: string; status: string }>("SELECT id, status FROM runs WHERE id = ANY($1::uuid[])", [runIds]);
  return new Map(rows.map((r) => [r.id, r.status]));
}

function countBy(values: Iterable<string>): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1;
  return counts;
}


interface StepRow {
  run_id: string;
  id: string;
  index: number;
  lease_epoch: string;
  request: { messages: { role: string; content: string }[] } | null;
}

interface InvocationRow {
  id: string;
  run_id: string;
  step_index: number;
  tool_name: string;
  status: string;
  resolved_outcome: string | null;
  resolved_by_actor_id: string | null;
  streams: string[];
}

// ---- the matrix --------------------------------------------------------------------------

const cleanups: (() => Promise<void>)[] = [];

describe(`crash matrix: ${RUNS} runs per crash point, the server SIGKILLs itself once per run`, () => {
  afterEach(async () => {
    await killAllChildren();
  });
  afterAll(async () => {
    await killAllChildren();
    for (const cleanup of cleanups.splice(0)) await cleanup();
  });

  for (const point of POINTS) {
    it(`${point}: every run finishes exactly once`, { timeout: POINT_BUDGET_MS + 30_000 }, async () => {
      const started = Date.now();
      const deadline = started + POINT_BUDGET_MS;
      const overdue = (what: string, detail: () => string) => {
        if (Date.now() > deadline) throw new Error(`${point}: out of time ${what}; ${detail()}`);
      };

      const databaseUrl = await createTestDatabase();
      const dir = await mkdtemp(path.join(tmpdir(), `keel-crash-matrix-${point}-`));
      const effectsDir = path.join(dir, "effects");
      const faultDir = path.join(dir, "faults");
      const db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
      cleanups.push(async () => {
        await db.end().catch(() => {});
        await rm(dir, { recursive: true, force: true });
      });
      const agent = matrixAgent(`matrix-${point.replaceAll("_", "-")}`);
      const token = await prepareLedger(databaseUrl, [agent]);
      await mkdir(effectsDir, { recursive: true });

      const supervisor = new Supervisor({
        DATABASE_URL: databaseUrl,
        KEEL_EFFECTS_DIR: effectsDir,
        KEEL_FAULT: point,
        KEEL_FAULT_DIR: faultDir,
        KEEL_TEST_AGENTS: JSON.stringify([agent]),
        KEEL_LEASE_MS: "1000",
        KEEL_IDLE_POLL_MS: "200",
        KEEL_WORKERS: "2",
        KEEL_DB_POOL_MAX: "5",
        KEEL_LOG_LEVEL: "warn",
        KEEL_FAULT_GRACE_MS: "250",
      });
      const faults = async () => (await readdir(faultDir).catch(() => [])).filter((f) => f.endsWith(".fault")).length;

      try {
        // Submit every run; the server may die under us, and a resubmitted message id is a duplicate, not a new run.
        const runIdOf = new Map<number, string>();
        while (runIdOf.size < RUNS) {
          overdue("submitting", () => `${runIdOf.size}/${RUNS} submitted`);
          const server = await supervisor.ensure();
          const ingress = connectClient(IngressService, server.url, token);
          const missing = Array.from({ length: RUNS }, (_, i) => i).filter((i) => !runIdOf.has(i));
          await Promise.all(
            missing.map(async (i) => {
              try {
                const { runId } = await ingress.submitMessage(
                  { agentId: agent.id, conversationId: `conv-${i}`, actor: { id: "alice", displayName: "Alice" }, messageId: `msg-${i}`, text: `run ${i}`, connector: "crash-matrix" },
                  { timeoutMs: 5_000 },
                );
                runIdOf.set(i, runId);
              } catch {
                // the server died; submit again to the next one
              }
            }),
          );
        }
        const runIds = [...runIdOf.values()];
        expect(new Set(runIds).size).toBe(RUNS);

        /** Keeps a server up until every run is in one of `done` (or terminal). */
        const driveUntil = async (what: string, done: (status: string) => boolean) => {
          for (;;) {
            const now = await statuses(db, runIds);
            if (runIds.every((id) => done(now.get(id) ?? "missing"))) return;
            overdue(what, () => `statuses ${JSON.stringify(countBy(now.values()))}, ${supervisor.starts} starts, deaths ${supervisor.deaths.length}`);
            await supervisor.ensure();
            await sleep(100);
          }
        };
        await driveUntil("waiting for every run to finish or wait", (s) => TERMINAL.has(s) || s === "waiting");
        const crashedStarts = supervisor.starts;

        // An operator checks each unknown outcome by hand and says it applied.
        let resolved = 0;
        for (;;) {
          const { rows: open } = await db.query<{ id: string; run_id: string }>(
            "SELECT id, run_id FROM tool_invocations WHERE run_id = ANY($1::uuid[]) AND status = 'unknown_outcome' AND resolved_outcome IS NULL",
            [runIds],
          );
          if (open.length === 0) break;
          overdue("resolving unknown outcomes", () => `${open.length} still open`);
          const server = await supervisor.ensure();
          const runs = connectClient(RunService, server.url, token);
          for (const invocation of open) {
            try {
              await runs.resolveUnknownOutcome(
                {
                  runId: invocation.run_id,
                  toolInvocationId: invocation.id,
                  outcome: ResolvedOutcome.APPLIED,
                  actor: { id: "operator", displayName: "Operator" },
                  reason: "checked by hand",
                },
                { timeoutMs: 5_000 },
              );
              resolved += 1;
            } catch {
              // the server died mid-call; the query above shows whether it took
            }
          }
        }
        await driveUntil("waiting for every run to settle", (s) => TERMINAL.has(s));
        await supervisor.stop();

        const faulted = await faults();
        console.log(
          `crash-matrix ${point}: ${RUNS} runs, ${faulted} faults, ${supervisor.starts} server starts ` +
            `(${crashedStarts} until all finished or waiting), ${resolved} unknown outcomes resolved, ${((Date.now() - started) / 1000).toFixed(1)} s`,
        );

        // ---- what the ledger and the effects file say ----
        const { rows: runRows } = await db.query<{ id: string; status: string; step_count: number; final_reply: string | null; commit_boundary: string }>(
          "SELECT id, status, step_count, final_reply, commit_boundary FROM runs WHERE id = ANY($1::uuid[])",
          [runIds],
        );
        const { rows: stepRows } = await db.query<StepRow>(
          `SELECT s.run_id, s.id, s.index, s.lease_epoch, m.request FROM run_steps s
           LEFT JOIN model_calls m ON m.step_id = s.id WHERE s.run_id = ANY($1::uuid[]) ORDER BY s.run_id, s.index`,
          [runIds],
        );
        const { rows: modelCalls } = await db.query<{ run_id: string; n: string; orphans: string }>(
          `SELECT m.run_id, count(*) AS n, count(*) FILTER (WHERE s.id IS NULL) AS orphans FROM model_calls m
           LEFT JOIN run_steps s ON s.id = m.step_id WHERE m.run_id = ANY($1::uuid[]) GROUP BY m.run_id`,
          [runIds],
        );
        const { rows: invocations } = await db.query<InvocationRow>(
          `SELECT t.id, t.run_id, s.index AS step_index, t.tool_name, t.status, t.resolved_outcome, t.resolved_by_actor_id,
             coalesce(array_agg(o.stream ORDER BY o.seq) FILTER (WHERE o.id IS NOT NULL), '{}') AS streams
           FROM tool_invocations t JOIN run_steps s ON s.id = t.step_id LEFT JOIN observations o ON o.tool_invocation_id = t.id
           WHERE t.run_id = ANY($1::uuid[]) GROUP BY t.id, s.index ORDER BY t.run_id, s.index, t.ordinal`,
          [runIds],
        );
        const { rows: emissions } = await db.query<{ run_id: string; kind: string; text: string; ack_state: string | null }>(
          "SELECT run_id, kind, text, ack_state FROM emissions WHERE run_id = ANY($1::uuid[])",
          [runIds],
        );
        const { rows: events } = await db.query<{ run_id: string; summary: string }>(
          "SELECT run_id, summary FROM run_events WHERE run_id = ANY($1::uuid[]) AND kind = 'status_changed' ORDER BY run_id, seq",
          [runIds],
        );
        const writes = writesRecorded(effectsDir).map((line) => {
          const [invocationId, key] = line.split(" ");
          return { invocationId: invocationId ?? "", key: key ?? "" };
        });

        // Each run faulted exactly once, at this point; no process logged an error or gave up waiting for quiet.
        expect(faulted).toBe(RUNS);
        expect(supervisor.alarms).toEqual([]);
        // No write ran twice: one line per execution, each a distinct invocation.
        expect(new Set(writes.map((w) => w.invocationId)).size).toBe(writes.length);
        expect(writes).toHaveLength(RUNS);

        const problems: string[] = [];
        const check = (runId: string, ok: boolean, what: string) => {
          if (!ok) problems.push(`${runId}: ${what}`);
        };
        for (const run of runRows) {
          const id = run.id;
          const steps = stepRows.filter((s) => s.run_id === id);
          const calls = invocations.filter((i) => i.run_id === id);
          const runWrites = writes.filter((w) => calls.some((c) => c.id === w.invocationId));
          const replies = emissions.filter((e) => e.run_id === id && e.kind === "reply");
          const settledAcks = emissions.filter((e) => e.run_id === id && e.kind === "ack" && (e.ack_state === "succeeded" || e.ack_state === "failed"));
          const runEvents = events.filter((e) => e.run_id === id).map((e) => e.summary);

          // Every run succeeded (none stuck), with exactly one reply and one settled ack.
          check(id, run.status === "succeeded", `status ${run.status}`);
          check(id, run.final_reply === "done", `final reply ${String(run.final_reply)}`);
          check(id, replies.length === 1 && replies[0]?.text === "done", `replies ${JSON.stringify(replies.map((r) => r.text))}`);
          check(id, settledAcks.length === 1 && settledAcks[0]?.ack_state === "succeeded", `settled acks ${JSON.stringify(settledAcks)}`);
          // However often it was retried, the request showed started and thinking once each.
          const lifecycle = emissions.filter((e) => e.run_id === id && (e.ack_state === "started" || e.ack_state === "thinking")).map((e) => e.ack_state);
          check(id, JSON.stringify(lifecycle.sort()) === JSON.stringify(["started", "thinking"]), `lifecycle acks ${JSON.stringify(lifecycle)}`);
          // No committed step lost or duplicated: indexes 0..k-1, k = step_count, one model call per step.
          check(id, JSON.stringify(steps.map((s) => s.index)) === JSON.stringify([0, 1, 2, 3]), `step indexes ${JSON.stringify(steps.map((s) => s.index))}`);
          check(id, run.step_count === steps.length, `step_count ${run.step_count} but ${steps.length} steps`);
          const mc = modelCalls.find((m) => m.run_id === id);
          check(id, Number(mc?.n ?? 0) === steps.length && Number(mc?.orphans ?? 0) === 0, `model calls ${JSON.stringify(mc)}`);
          check(id, steps.every((s) => s.request !== null), "a step without its model call");
          const epochs = steps.map((s) => Number(s.lease_epoch));
          check(id, epochs.every((e, i) => i === 0 || e >= epochs[i - 1]!), `step epochs go backwards ${JSON.stringify(epochs)}`);
          // The process died holding this run: it was reclaimed after its lease expired.
          check(id, runEvents.some((s) => s.includes("reclaimed by")), `never reclaimed: ${JSON.stringify(runEvents)}`);
          // The script: read a, read b, write w, reply.
          const shape = calls.map((c) => `${c.step_index}:${c.tool_name}`).join(" ");
          check(id, shape === "0:test.echo.v1 1:test.echo.v1 2:test.append_line.v1", `tool calls ${shape}`);
          const [readA, readB, write] = calls;
          if (readA === undefined || readB === undefined || write === undefined) continue;
          // The write ran exactly once, as this run's write invocation.
          check(id, runWrites.length === 1 && runWrites[0]?.invocationId === write.id && runWrites[0]?.key === "w", `write lines ${JSON.stringify(runWrites)}`);
          check(id, run.commit_boundary === "committed", `commit boundary ${run.commit_boundary}`);
          check(id, readB.status === "succeeded", `second read ${readB.status}`);
          const toolMessages = (step: StepRow | undefined) => (step?.request?.messages ?? []).filter((m) => m.role === "tool").map((m) => m.content);

          switch (point) {
            case "after_model_call":
              // The answered model call was lost with the process and asked again by the next worker.
              check(id, readA.status === "succeeded" && write.status === "succeeded", `statuses ${readA.status} ${write.status}`);
              check(id, Number(steps[0]?.lease_epoch) >= 2, `first step committed at epoch ${String(steps[0]?.lease_epoch)}`);
              break;
            case "after_intent":
            case "during_read":
            case "after_tool_result": {
              // A read caught in flight is marked interrupted; the model is told so and reads again.
              check(id, readA.status === "interrupted", `first read ${readA.status}`);
              check(id, write.status === "succeeded", `write ${write.status}`);
              const told = toolMessages(steps[1]);
              check(id, told.length === 1 && told[0]!.startsWith("Interrupted:"), `model was shown ${JSON.stringify(told)} after the interruption`);
              // after_intent: never dispatched; during_read / after_tool_result: it ran, its result never committed.
              const expected = point === "after_intent" ? [] : ["stdout"];
              check(id, JSON.stringify(readA.streams) === JSON.stringify(expected), `interrupted read observations ${JSON.stringify(readA.streams)}`);
              break;
            }
            case "during_write": {
              // Effect done, result lost: never replayed; unknown until the operator said it applied.
              check(id, readA.status === "succeeded", `first read ${readA.status}`);
              check(id, write.status === "unknown_outcome" && write.resolved_outcome === "applied" && write.resolved_by_actor_id === "operator",
                `write ${write.status}/${String(write.resolved_outcome)}/${String(write.resolved_by_actor_id)}`);
              check(id, runEvents.some((s) => s.startsWith("unknown outcomes resolved by operator")), "not requeued by the resolution");
              const told = toolMessages(steps[3]);
              check(id, told.at(-1)?.includes("determined it took effect: checked by hand") === true, `model was shown ${JSON.stringify(told.at(-1))}`);
              break;
            }
          }
          if (point !== "during_write") {
            check(id, calls.every((c) => c.status !== "unknown_outcome"), "an unknown outcome outside during_write");
          }
        }
        expect(runRows).toHaveLength(RUNS);
        expect(problems).toEqual([]);
      } catch (error) {
        console.error(`crash-matrix ${point} failed; last fault-serve output:\n${supervisor.current?.output.slice(-30).join("\n") ?? "(none)"}`);
        throw error;
      } finally {
        await supervisor.stop();
      }
    });
  }

  // A step with two calls, a write then a read, killed once both intents are committed: the
  // resumed worker settles both and must leave the run waiting for the operator at once,
  // not holding it in awaiting_tool until its lease runs out and another worker finds it.
  it("after_intent on a step with a write and a read: the run waits at once", { timeout: 90_000 }, async () => {
    const runs = 3;
    const started = Date.now();
    const databaseUrl = await createTestDatabase();
    const dir = await mkdtemp(path.join(tmpdir(), "keel-crash-matrix-pair-"));
    const effectsDir = path.join(dir, "effects");
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    cleanups.push(async () => {
      await db.end().catch(() => {});
      await rm(dir, { recursive: true, force: true });
    });
    const base = matrixAgent("matrix-pair");
    const model = scriptedModel([turn("", [toolCall("test.append_line.v1", { key: "w" }), toolCall("test.echo.v1", { text: "a" })]), turn("done")]);
    const agent: AgentSpec = { ...base, models: { primary: model, fast: model, decision: model } };
    const token = await prepareLedger(databaseUrl, [agent]);
    await mkdir(effectsDir, { recursive: true });
    const supervisor = new Supervisor({
      DATABASE_URL: databaseUrl,
      KEEL_EFFECTS_DIR: effectsDir,
      KEEL_FAULT: "after_intent",
      KEEL_FAULT_DIR: path.join(dir, "faults"),
      KEEL_TEST_AGENTS: JSON.stringify([agent]),
      KEEL_LEASE_MS: "1000",
      KEEL_IDLE_POLL_MS: "200",
      KEEL_WORKERS: "2",
      KEEL_DB_POOL_MAX: "5",
      KEEL_LOG_LEVEL: "warn",
      KEEL_FAULT_GRACE_MS: "250",
    });
    try {
      const runIdOf = new Map<number, string>();
      while (runIdOf.size < runs) {
        if (Date.now() - started > 60_000) throw new Error(`only ${runIdOf.size}/${runs} submitted`);
        const ingress = connectClient(IngressService, (await supervisor.ensure()).url, token);
        for (let i = 0; i < runs; i++) {
          if (runIdOf.has(i)) continue;
          try {
            const { runId } = await ingress.submitMessage(
              { agentId: agent.id, conversationId: `pair-${i}`, actor: { id: "alice", displayName: "Alice" }, messageId: `pair-${i}`, text: `pair ${i}`, connector: "crash-matrix" },
              { timeoutMs: 5_000 },
            );
            runIdOf.set(i, runId);
          } catch {
            break; // the server died; start the next one
          }
        }
      }
      const runIds = [...runIdOf.values()];
      for (;;) {
        const now = await statuses(db, runIds);
        if (runIds.every((id) => now.get(id) === "waiting")) break;
        if (Date.now() - started > 60_000) throw new Error(`runs not waiting: ${JSON.stringify(countBy(now.values()))}`);
        await supervisor.ensure();
        await sleep(100);
      }
      await supervisor.stop();

      const { rows: calls } = await db.query<{ run_id: string; tool_name: string; status: string }>(
        "SELECT run_id, tool_name, status FROM tool_invocations WHERE run_id = ANY($1::uuid[]) ORDER BY run_id, ordinal",
        [runIds],
      );
      const { rows: events } = await db.query<{ run_id: string; summary: string }>(
        "SELECT run_id, summary FROM run_events WHERE run_id = ANY($1::uuid[]) AND kind = 'status_changed' ORDER BY run_id, seq",
        [runIds],
      );
      const { rows: waiting } = await db.query<{ id: string; wait_reason: string | null; lease_owner: string | null }>(
        "SELECT id, wait_reason, lease_owner FROM runs WHERE id = ANY($1::uuid[])",
        [runIds],
      );
      for (const runId of runIds) {
        expect(calls.filter((c) => c.run_id === runId).map((c) => `${c.tool_name}:${c.status}`)).toEqual([
          "test.append_line.v1:unknown_outcome",
          "test.echo.v1:interrupted",
        ]);
        // Reclaimed once, after the crash; a second reclaim means the resumed worker left it held.
        const reclaims = events.filter((e) => e.run_id === runId && e.summary.includes("reclaimed by")).map((e) => e.summary);
        expect(reclaims, runId).toHaveLength(1);
      }
      expect(waiting.map((r) => [r.wait_reason, r.lease_owner])).toEqual(runIds.map(() => ["unknown_write_outcome", null]));
      expect(writesRecorded(effectsDir)).toEqual([]); // the write never ran

      // The operator checks the effects log, finds no line, and says so: the runs finish.
      const { rows: open } = await db.query<{ id: string; run_id: string }>(
        "SELECT id, run_id FROM tool_invocations WHERE run_id = ANY($1::uuid[]) AND status = 'unknown_outcome'",
        [runIds],
      );
      const server = await supervisor.ensure();
      for (const invocation of open) {
        await connectClient(RunService, server.url, token).resolveUnknownOutcome({
          runId: invocation.run_id,
          toolInvocationId: invocation.id,
          outcome: ResolvedOutcome.NOT_APPLIED,
          actor: { id: "operator", displayName: "Operator" },
          reason: "no line in the effects log",
        });
      }
      for (;;) {
        const now = await statuses(db, runIds);
        if (runIds.every((id) => now.get(id) === "succeeded")) break;
        if (Date.now() - started > 75_000) throw new Error(`runs not finished: ${JSON.stringify(countBy(now.values()))}`);
        await supervisor.ensure();
        await sleep(100);
      }
      const { rows: replies } = await db.query<{ text: string }>("SELECT text FROM emissions WHERE run_id = ANY($1::uuid[]) AND kind = 'reply'", [runIds]);
      expect(replies.map((r) => r.text)).toEqual(runIds.map(() => "done"));
      expect(writesRecorded(effectsDir)).toEqual([]); // and it was never replayed
    } finally {
      await supervisor.stop();
    }
  });
});
