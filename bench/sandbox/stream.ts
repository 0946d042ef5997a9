// Phase 3: observation streaming into the ledger, against a raw dockerode read of the same output.
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type Dockerode from "dockerode";
import type pg from "pg";
import type { KeelApp } from "../../control-plane/src/app.js";
import type { ObservationText } from "../../control-plane/src/domain/sandbox.js";
import { insertBenchInvocation } from "./bench-run.js";
import { cpuMeter, startProfile, type CpuLap } from "./cpu-meter.js";
import { MiB, TIMED_STREAMS } from "./options.js";
import { rawExec } from "./raw-exec.js";

/** Lifetime peak resident set of this process, in MiB (maxRSS is in KiB). */
const peakRssMb = (): number => process.resourceUsage().maxRSS / 1024;

export interface StreamPhase {
  readonly bytes: number;
  readonly observations: number;
  readonly keelMs: number;
  readonly rawMs: number;
  readonly discardMs: number;
  /** The median of the timed streams, and each of them in the order run. */
  readonly keelMbS: number;
  readonly keelMbSRange: readonly number[];
  /** The first stream through keel (the process's first large one), not counted. */
  readonly firstMbS: number;
  readonly firstCpu: CpuLap;
  readonly discardMbS: number;
  readonly rawMbS: number;
  readonly keelCpu: CpuLap;
  readonly discardCpu: CpuLap;
  readonly rawCpu: CpuLap;
  readonly rssBeforeMb: number;
  readonly peakRssMb: number;
  readonly settings: string;
}

export async function streamPhase(
  target: {
    dispatcher: KeelApp["sandbox"]["dispatcher"];
    workspaceId: string;
    runId: string;
    container: Dockerode.Container;
    db: pg.Client;
    maxOutputBytes: number;
    streamBytes: number;
    cpu: { agentPid: number | undefined; postgresDataDir: string };
  },
  /** The observation log of one call, as the runner gets it from its store (the ledger numbers the rows). */
  observationLog: (invocationId: string) => { append(stream: string, text: ObservationText): Promise<void> },
  progress: (line: string) => void,
): Promise<StreamPhase> {
  const { dispatcher, workspaceId, container, db, streamBytes } = target;
  const shown = await db.query<{ fsync: string; synchronous_commit: string }>(
    "SELECT current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS synchronous_commit",
  );
  const settings = `fsync=${shown.rows[0]?.fsync ?? "?"} synchronous_commit=${shown.rows[0]?.synchronous_commit ?? "?"}`;
  // Printable output (no NULs for the ledger to replace): `a` repeated, written once into the
  // workspace untimed and then read by `cat`, so the producer (busybox tr manages well under
  // 100 MiB/s here) does not bound the stream or its baseline.
  const file = "/workspace/.bench-stream";
  const made = await rawExec(container, ["sh", "-c", `head -c ${streamBytes} /dev/zero | tr '\\0' a > ${file}`]);
  if (made.exitCode !== 0) throw new Error(`writing the ${streamBytes}-byte stream file in the workspace failed with exit code ${made.exitCode ?? "none"}`);
  const argv = ["cat", file];

  // Keel first: this process's peak RSS must not include the raw read's buffers.
  const rssBeforeMb = peakRssMb();
  let streams = 0;
  /** One stream through keel into the observations table, checked byte for byte afterwards. */
  const throughKeel = async (label: string): Promise<{ ms: number; cpu: CpuLap; observations: number }> => {
    const invocationId = await insertBenchInvocation(target.db, target.runId, ++streams);
    const log = observationLog(invocationId);
    progress(`${label}: streaming ${streamBytes / MiB} MiB through keel into the observations table (output cap ${target.maxOutputBytes} bytes)`);
    const profile = await startProfile("stream");
    const cpu = cpuMeter(target.cpu);
    const started = performance.now();
    const result = await dispatcher.exec(
      workspaceId,
      invocationId,
      { argv, workingDirectory: "/workspace", env: {}, timeoutMs: 600_000, maxOutputBytes: target.maxOutputBytes },
      (stream, text) => log.append(stream, text),
      AbortSignal.timeout(660_000),
    );
    const elapsed = performance.now() - started;
    const spent = cpu.lap();
    await profile?.stop(progress);
    if (result.exitCode !== 0 || result.timedOut || result.outputTruncated || result.outputBytes !== streamBytes) {
      throw new Error(
        `the stream exec ended with exit code ${result.exitCode}, timedOut ${result.timedOut}, truncated ${result.outputTruncated}, ${result.outputBytes} of ${streamBytes} bytes`,
      );
    }
    // Every byte is in the ledger, and nothing but the command's stdout.
    const stored = await db.query<{ n: string; bytes: string | null; bad: string }>(
      `SELECT count(*) AS n, sum(octet_length(text)) AS bytes, count(*) FILTER (WHERE stream <> 'stdout' OR text !~ '^a+$') AS bad
       FROM observations WHERE run_id = $1 AND tool_invocation_id = $2`,
      [target.runId, invocationId],
    );
    const row = stored.rows[0];
    const storedBytes = Number(row?.bytes ?? 0);
    if (storedBytes !== streamBytes || Number(row?.bad ?? 0) !== 0) {
      throw new Error(`the observations table holds ${storedBytes} of ${streamBytes} bytes (${row?.bad ?? "?"} observations not plain stdout 'a's)`);
    }
    const observations = Number(row?.n ?? 0);
    progress(`${label}: ${streamBytes} bytes in ${observations} observations in ${(elapsed / 1000).toFixed(2)} s (${(streamBytes / MiB / (elapsed / 1000)).toFixed(1)} MB/s)`);
    return { ms: elapsed, cpu: spent, observations };
  };
  // The process's first large stream pays for warming up (code not yet optimized, heap and
  // allocator growing to a stream's working set), as exec round trips do before their warm-up
  // is done: it is reported on its own line, and the target is judged on the median of the
  // streams after it.
  const first = await throughKeel("first stream");
  const timed: { ms: number; cpu: CpuLap; observations: number }[] = [];
  for (let i = 1; i <= TIMED_STREAMS; i++) timed.push(await throughKeel(`stream ${i}/${TIMED_STREAMS}`));
  const peak = peakRssMb();
  const median = [...timed].sort((a, b) => a.ms - b.ms)[Math.floor(TIMED_STREAMS / 2)]!;

  // The same stream with a sink that drops it: what the control plane and agent cost without the ledger.
  const cpu = cpuMeter(target.cpu);
  const discardProfile = await startProfile("discard");
  const discardStarted = performance.now();
  const discarded = await dispatcher.exec(
    workspaceId,
    randomUUID(),
    { argv, workingDirectory: "/workspace", env: {}, timeoutMs: 600_000, maxOutputBytes: target.maxOutputBytes },
    async () => {},
    AbortSignal.timeout(660_000),
  );
  const discardMs = performance.now() - discardStarted;
  const discardCpu = cpu.lap();
  await discardProfile?.stop(progress);
  if (discarded.exitCode !== 0 || discarded.outputBytes !== streamBytes) throw new Error(`the discarded stream exec ended with exit code ${discarded.exitCode} after ${discarded.outputBytes} bytes`);
  progress(`keel, output discarded instead of persisted: ${streamBytes} bytes in ${(discardMs / 1000).toFixed(2)} s`);

  cpu.lap();
  const rawStarted = performance.now();
  const raw = await rawExec(container, argv);
  const rawMs = performance.now() - rawStarted;
  const rawCpu = cpu.lap();
  if (raw.exitCode !== 0 || raw.bytes !== streamBytes) throw new Error(`the raw stream exec ended with exit code ${raw.exitCode ?? "none"} after ${raw.bytes} bytes`);
  progress(`raw dockerode: ${raw.bytes} bytes in ${(rawMs / 1000).toFixed(2)} s`);

  const mbS = (elapsedMs: number) => streamBytes / MiB / (elapsedMs / 1000);
  return {
    bytes: streamBytes,
    observations: median.observations,
    keelMs: median.ms,
    rawMs,
    discardMs,
    keelMbS: mbS(median.ms),
    keelMbSRange: timed.map((t) => mbS(t.ms)),
    firstMbS: mbS(first.ms),
    firstCpu: first.cpu,
    rawMbS: mbS(rawMs),
    discardMbS: mbS(discardMs),
    keelCpu: median.cpu,
    discardCpu,
    rawCpu,
    rssBeforeMb,
    peakRssMb: peak,
    settings,
  };
}
