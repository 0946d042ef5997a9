// The chaos workload: a closed loop of root runs submitted over gRPC to whichever replica is
// up (a failed call is retried elsewhere with the same message id, which admission treats as
// the same message), their progress read from the ledger, and one connector's Subscribe stream
// that counts every emission it receives by idempotency key and resumes from its last seq.
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import pg from "pg";
import { DeliveryStatus, EmissionKind, EmissionService } from "../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../gen/keel/v1/ingress_service_pb.js";
import { grpcClient } from "../../test/support/clients.js";

export const CONNECTOR = "chaos";
const CALL_TIMEOUT_MS = 5_000;
/** How long one submission is retried across replicas before the slot gives up on it. */
const SUBMIT_DEADLINE_MS = 120_000;
/** How long a slot waits for its run before moving on (the run is still checked at the end). */
const RUN_WAIT_MS = 120_000;
const POLL_MS = 500;

export interface TrackedRun {
  readonly runId: string;
  readonly submittedAt: number;
  finishedAt: number | undefined;
  status: string;
}

export interface WorkloadStats {
  submitted: number;
  /** Submissions no replica acknowledged within the deadline (the run may still exist). */
  unacknowledged: number;
  submitRetries: number;
  /** Errors the replicas answered SubmitMessage and Subscribe with, by gRPC code name (our own cancels left out). */
  readonly rpcErrors: Record<string, number>;
}

export interface Workload {
  readonly runs: ReadonlyMap<string, TrackedRun>;
  readonly stats: WorkloadStats;
  /** Emission keys received on the connector's stream, with how many times each came. */
  readonly received: ReadonlyMap<string, number>;
  /** Reply emissions received per run. */
  readonly repliesByRun: ReadonlyMap<string, number>;
  lastSeq(): bigint;
  subscriberReconnects(): number;
  /** Runs that finished (terminal, or waiting on an unknown outcome) between two instants. */
  finishedBetween(from: number, to: number): number;
  inFlight(): number;
  /** Stops submitting; runs already submitted are still followed. */
  stopSubmitting(): Promise<void>;
  /** Stops following runs and the stream. */
  close(): Promise<void>;
}

export interface WorkloadOptions {
  readonly databaseUrl: string;
  readonly agentId: string;
  readonly token: string;
  readonly concurrency: number;
  readonly liveUrls: () => string[];
}

/** Terminal, or parked on a write whose outcome nobody knows: what a run may be left in. */
export function isSettled(status: string, waitReason: string | null): boolean {
  return ["succeeded", "failed", "cancelled", "budget_exhausted"].includes(status) || (status === "waiting" && waitReason === "unknown_write_outcome");
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export function startWorkload(options: WorkloadOptions): Workload {
  const runs = new Map<string, TrackedRun>();
  const stats: WorkloadStats = { submitted: 0, unacknowledged: 0, submitRetries: 0, rpcErrors: {} };
  const countError = (error: unknown) => {
    const code = Code[ConnectError.from(error).code];
    stats.rpcErrors[code] = (stats.rpcErrors[code] ?? 0) + 1;
  };
  const received = new Map<string, number>();
  const repliesByRun = new Map<string, number>();
  let lastSeq = 0n;
  let reconnects = 0;
  let submitting = true;
  let following = true;
  let next = 0;
  const tag = Date.now().toString(36);

  // The ledger is read directly; while PostgreSQL restarts a poll fails and the next one tries again.
  const db = new pg.Pool({ connectionString: options.databaseUrl, max: 2 });
  db.on("error", () => {}); // an idle client cut by a restart: the pool replaces it

  const ingress = new Map<string, Client<typeof IngressService>>();
  const ingressAt = (url: string) => {
    let client = ingress.get(url);
    if (client === undefined) ingress.set(url, (client = grpcClient(IngressService, url, options.token)));
    return client;
  };
  const pickLive = (): string | undefined => {
    const urls = options.liveUrls();
    return urls[Math.floor(Math.random() * urls.length)];
  };

  const submit = async (n: number): Promise<string | undefined> => {
    const deadline = Date.now() + SUBMIT_DEADLINE_MS;
    for (let attempt = 0; Date.now() < deadline; attempt++) {
      const url = pickLive();
      if (url !== undefined) {
        try {
          const { runId } = await ingressAt(url).submitMessage(
            { agentId: options.agentId, conversationId: `chaos-${tag}-${n}`, actor: { id: "chaos" }, messageId: `chaos-${tag}-${n}`, text: `job ${n}`, connector: CONNECTOR },
            { timeoutMs: CALL_TIMEOUT_MS },
          );
          return runId;
        } catch (error) {
          countError(error);
          stats.submitRetries += 1;
        }
      }
      await sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 4)));
    }
    stats.unacknowledged += 1;
    return undefined;
  };

  const poll = async () => {
    while (following) {
      const open = [...runs.values()].filter((r) => r.finishedAt === undefined).map((r) => r.runId);
      if (open.length > 0) {
        try {
          const { rows } = await db.query<{ id: string; status: string; wait_reason: string | null }>(
            "SELECT id::text AS id, status, wait_reason FROM runs WHERE id = ANY($1::uuid[])",
            [open],
          );
          const now = Date.now();
          for (const row of rows) {
            const run = runs.get(row.id);
            if (run === undefined) continue;
            run.status = row.status;
            if (isSettled(row.status, row.wait_reason)) run.finishedAt = now;
          }
        } catch {
          // PostgreSQL is restarting
        }
      }
      await sleep(POLL_MS);
    }
  };

  const slot = async () => {
    while (submitting) {
      const n = next++;
      const runId = await submit(n);
      if (runId === undefined) continue;
      stats.submitted += 1;
      const run: TrackedRun = { runId, submittedAt: Date.now(), finishedAt: undefined, status: "queued" };
      runs.set(runId, run);
      const giveUpAt = Date.now() + RUN_WAIT_MS;
      while (run.finishedAt === undefined && Date.now() < giveUpAt && following) await sleep(100);
    }
  };

  // The connector reports each reply delivered, as a real one would: one more RPC that must keep
  // answering (or fail retryably) while replicas and the database fail. A failed ack is not retried.
  const acks = new Set<Promise<void>>();
  const emissions = new Map<string, Client<typeof EmissionService>>();
  const acknowledge = (emissionId: string) => {
    const url = pickLive();
    if (url === undefined) return;
    let client = emissions.get(url);
    if (client === undefined) emissions.set(url, (client = grpcClient(EmissionService, url, options.token)));
    const ack = client
      .acknowledgeEmission({ emissionId, outcome: DeliveryStatus.DELIVERED }, { timeoutMs: CALL_TIMEOUT_MS })
      .then(
        () => undefined,
        (error: unknown) => countError(error),
      )
      .finally(() => acks.delete(ack));
    acks.add(ack);
  };

  const subscribe = async () => {
    while (following) {
      const url = pickLive();
      if (url === undefined) {
        await sleep(200);
        continue;
      }
      const abort = new AbortController();
      // A stopped or killed replica leaves the stream silent, not broken: leave it when its replica is gone.
      const watchdog = setInterval(() => {
        if (!following || !options.liveUrls().includes(url)) abort.abort();
      }, 250);
      try {
        const stream = grpcClient(EmissionService, url, options.token).subscribe({ connector: CONNECTOR, afterSeq: lastSeq }, { signal: abort.signal });
        for await (const { emission } of stream) {
          if (emission === undefined) continue;
          received.set(emission.idempotencyKey, (received.get(emission.idempotencyKey) ?? 0) + 1);
          if (emission.kind === EmissionKind.REPLY) {
            repliesByRun.set(emission.runId, (repliesByRun.get(emission.runId) ?? 0) + 1);
            acknowledge(emission.id);
          }
          if (emission.seq > lastSeq) lastSeq = emission.seq;
        }
      } catch (error) {
        // The replica went away or the stream was cut: resume from lastSeq elsewhere.
        if (!abort.signal.aborted) countError(error);
      } finally {
        clearInterval(watchdog);
      }
      if (following) {
        reconnects += 1;
        await sleep(200);
      }
    }
  };

  const slots = Array.from({ length: options.concurrency }, () => slot());
  const background = [poll(), subscribe()];

  return {
    runs,
    stats,
    received,
    repliesByRun,
    lastSeq: () => lastSeq,
    subscriberReconnects: () => reconnects,
    finishedBetween: (from, to) => [...runs.values()].filter((r) => r.finishedAt !== undefined && r.finishedAt >= from && r.finishedAt < to).length,
    inFlight: () => [...runs.values()].filter((r) => r.finishedAt === undefined).length,
    async stopSubmitting() {
      submitting = false;
      await Promise.all(slots);
    },
    async close() {
      submitting = false;
      following = false;
      await Promise.all([...slots, ...background]);
      await Promise.all([...acks]);
      await db.end();
    },
  };
}
