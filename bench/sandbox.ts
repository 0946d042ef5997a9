// Sandbox benchmark, on the real Docker engine, each number beside a baseline timed in the same
// run:
//
//   1. Warm-pool acquisition: acquire() on a docker backend whose warm pool (per image) holds
//      started containers, waiting for the pool to refill before each take, so every sample is
//      a warm take. Baseline: create + start of an equally hardened container straight through
//      dockerode (the cold path's floor), removed after each sample.
//   2. Exec round trip: a real Keel (embedded PostgreSQL with default durability, --durability mode, the HTTP/2
//      server on loopback) and a real `keel sandbox-agent` child process (docker backend)
//      attached to it over SandboxService.Attach; one workspace acquired for a run through the
//      dispatcher the exec tools use, then `true` run through it (control plane → Attach stream
//      → agent → docker exec → result back). Baseline: a raw dockerode exec of `true` in the
//      same container (found by its keel.workspace-id label), read to the end and inspected for
//      its exit code. The two are interleaved so drift hits both alike.
//   3. Streaming: an exec printing --stream-mib MiB of `a` (a file written into the workspace
//      untimed, then `cat`) through the dispatcher with the output cap raised above it
//      (KEEL_SANDBOX_MAX_OUTPUT_BYTES), every chunk persisted as observations by the run store's
//      observationLog (the runner's sink for exec tools), timed until the result is back and
//      the last observation is written; the observations table is checked to hold every byte.
//      Run six times: the first (the process's first large stream, still warming up) is
//      printed but not counted, and the figure is the median of the other five (one stream
//      takes well under a second, so one slow scheduling slice on a 2-core machine moves it).
//      Peak RSS is this process's lifetime peak (it hosts the control plane; the agent is a
//      separate process), beside its peak before the stream. Baseline: the same command through a
//      raw dockerode exec, read to the end. For diagnosis, the same stream through Keel with a
//      sink that drops the output splits transport from ledger cost.
//
// MB here is MiB (2^20 bytes).
//
// Beside the throughput, the CPU each party spent per MB of the stream (this process, the agent,
// PostgreSQL, the Docker engine; from /proc, Linux only): steadier than wall time on a shared
// machine, and it shows where a stream's cost goes. KEEL_BENCH_AGENT_NODE_ARGS passes Node flags to
// the agent child (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") for profiling it, KEEL_BENCH_AGENT_LOG=file
// appends everything the agent prints there, each line with its time (e.g. with "--trace-gc");
// KEEL_BENCH_PROFILE_DIR profiles this process over each timed stream through keel alone.
//
//   npm run bench -- sandbox [--acquisitions 30] [--cold 30] [--pool-size 4] [--execs 100] [--warmup 10] [--stream-mib 64]
import { randomBytes } from "node:crypto";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import Dockerode from "dockerode";
import pg from "pg";
import { pino } from "pino";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { DEFAULT_HOST_CAPACITY } from "../control-plane/src/domain/token-scope.js";
import { allowHeapGrowthForStreaming } from "../control-plane/src/heap-growth.js";
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from "../control-plane/src/ledger/embedded-postgres.js";
import { createRunRepository } from "../control-plane/src/ledger/run.repository.js";
import type { WorkspaceGrant } from "../control-plane/src/tools/sandbox-dispatcher.js";
import { LABELS } from "../sandbox-agent/src/docker/container-config.js";
import { coldPhase, warmPhase } from "./sandbox/acquisition.js";
import { startAgent, waitAttached, type AgentChild } from "./sandbox/agent-child.js";
import type { CpuLap } from "./sandbox/cpu-meter.js";
import { benchFence, insertBenchRun } from "./sandbox/bench-run.js";
import { execPhase } from "./sandbox/exec-round-trip.js";
import { MiB, parseOptions, TIMED_STREAMS } from "./sandbox/options.js";
import { streamPhase, type StreamPhase } from "./sandbox/stream.js";
import { freePort, ms, pick, summarize, table, verdict } from "./support.js";

const WARM_TARGET_MS = 20;
const EXEC_RATIO_TARGET = 1.3;
const STREAM_TARGET_MB_S = 100;
/**
 * The same target as a share of the raw dockerode read timed in the same run: 100 MB/s was met
 * beside a raw read of 310 MB/s (f114f99). That commit, run again on a machine whose raw read is
 * 129 MB/s, streams 59 MB/s: the absolute figure follows the machine, the share does not.
 */
const STREAM_RATIO_TARGET = 0.32;

export default async function sandboxBench(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  // This process hosts the control plane: with the garbage-collector headroom `keel serve` gives it
  // (the agent child gets its own from `keel sandbox-agent`).
  allowHeapGrowthForStreaming();
  const progress = (line: string) => process.stderr.write(`[sandbox] ${line}\n`);
  const docker = new Dockerode();
  try {
    await docker.ping();
  } catch (error) {
    throw new Error(`the Docker engine does not answer (${error instanceof Error ? error.message : String(error)}); start it with scripts/start-dockerd.sh`);
  }
  try {
    await docker.getImage(options.image).inspect();
  } catch {
    throw new Error(`image ${options.image} is missing; build it with scripts/build-sandbox-image.sh`);
  }

  const suffix = randomBytes(4).toString("hex");
  const hosts = { warm: `bench-warm-${suffix}`, cold: `bench-cold-${suffix}`, agent: `bench-agent-${suffix}` };
  const dir = await mkdtemp(path.join(tmpdir(), "keel-bench-sandbox-"));
  let postgres: EmbeddedPostgresHandle | undefined;
  let app: KeelApp | undefined;
  let agent: AgentChild | undefined;
  try {
    // As root, PostgreSQL runs as the postgres user, which must be able to reach its folder.
    if (process.getuid?.() === 0) await chmod(dir, 0o755);

    // ----- 1. warm-pool acquisition against a cold create + start -----
    const warm = await warmPhase(docker, hosts.warm, path.join(dir, "warm"), options, progress);
    const cold = await coldPhase(docker, hosts.cold, path.join(dir, "cold"), options, progress);

    // ----- 2 and 3 need Keel and an attached sandbox agent -----
    progress(`starting embedded PostgreSQL in ${dir} (server defaults: fsync and synchronous_commit on)`);
    postgres = await startEmbeddedPostgres({ dataDir: path.join(dir, "data"), port: await freePort() });
    const streamBytes = options.streamMib * MiB;
    const env = {
      DATABASE_URL: postgres.url,
      KEEL_LOG_LEVEL: "warn",
      KEEL_DURABILITY: options.durability,
      // The whole stream must fit under the cap; the cap's own maximum is 256 MiB.
      KEEL_SANDBOX_MAX_OUTPUT_BYTES: String(Math.min(256 * MiB, streamBytes + MiB)),
      ...pick(process.env, ["KEEL_DB_POOL_MAX"]),
    };
    const config = loadConfig(env);
    app = await buildApp(config, env, { log: pino({ level: "warn" }, pino.destination(2)) });
    const { secret: token } = await app.tokens.create("sandbox-host", "bench", { scope: { kind: "sandbox-host", hostId: hosts.agent, maxCapacity: DEFAULT_HOST_CAPACITY, labels: {} } });
    const { url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
    const agentDir = path.join(dir, "agent");
    agent = startAgent({ url, token, hostId: hosts.agent, dataDir: agentDir, image: options.image });
    await waitAttached(app, agent, hosts.agent);
    progress(`keel on ${url}; sandbox agent ${hosts.agent} (pid ${agent.child.pid ?? "?"}, docker backend) attached`);

    const dispatcher = app.sandbox.dispatcher;
    const db = new pg.Client({ connectionString: postgres.url });
    db.on("error", (error) => progress(`benchmark connection: ${error.message}`));
    await db.connect();
    let exec: Awaited<ReturnType<typeof execPhase>>;
    let stream: StreamPhase;
    let runId = "";
    try {
      runId = await insertBenchRun(db);
      const grant: WorkspaceGrant = { runId, agentId: "sandbox-bench", image: options.image, labels: [], networkAccess: false, secrets: {}, secretSources: {} };
      const acquireStarted = performance.now();
      const workspaceId = await dispatcher.workspaceFor(grant, AbortSignal.timeout(120_000));
      progress(`workspace ${workspaceId} acquired through the dispatcher in ${ms(performance.now() - acquireStarted)} ms`);
      const found = await docker.listContainers({ filters: { label: [`${LABELS.workspaceId}=${workspaceId}`, `${LABELS.hostId}=${hosts.agent}`] } });
      if (found.length !== 1 || found[0] === undefined) throw new Error(`expected one running container labelled ${LABELS.workspaceId}=${workspaceId}, found ${found.length}`);
      const container = docker.getContainer(found[0].Id);

      exec = await execPhase(dispatcher, workspaceId, container, config.sandbox.maxOutputBytes, options, progress);

      const store = createRunRepository(app.ledger.sql, { durability: config.durability });
      stream = await streamPhase(
        {
          dispatcher,
          workspaceId,
          runId,
          container,
          db,
          maxOutputBytes: config.sandbox.maxOutputBytes,
          streamBytes,
          cpu: { agentPid: agent.child.pid, postgresDataDir: path.join(dir, "data") },
        },
        (invocationId) => store.observationLog(benchFence(runId), invocationId),
        progress,
      );
      await dispatcher.releaseRun(runId).catch((error: unknown) => progress(`releasing the workspace failed: ${String(error)}`));
    } finally {
      await db.end();
    }

    const warmStats = summarize(warm);
    const coldStats = summarize(cold);
    const keelExec = summarize(exec.keel);
    const rawExec = summarize(exec.raw);
    const ratio = keelExec.p50 / rawExec.p50;
    const streamRatio = stream.keelMbS / stream.rawMbS;
    const perMb = (lap: CpuLap) =>
      [lap.controlPlane, lap.agent, lap.postgres, lap.docker].map((msSpent) => (msSpent / options.streamMib).toFixed(1)).join(" / ");
    const lines = [
      "",
      `sandbox: image ${options.image}; warm pool of ${options.poolSize}, ${warm.length} warm takes vs ${cold.length} cold create+start; ` +
        `${exec.keel.length} exec round trips of \`true\` each way (interleaved, ${options.warmup} warm-up each not counted); ` +
        `${TIMED_STREAMS + 1} stdout streams of ${options.streamMib} MiB each, the first not counted; embedded PostgreSQL 17 (${stream.settings}); ` +
        `Keel durability=${config.durability} (observations commit asynchronously in both modes; the baselines are dockerode, no ledger); MB = MiB`,
      "",
      ...table(
        ["metric", "value", "baseline", "target"],
        [
          ["warm acquire p50 ms (baseline: cold create+start via dockerode)", ms(warmStats.p50), ms(coldStats.p50), `<= ${WARM_TARGET_MS}`],
          ["warm acquire p99 ms (baseline: cold create+start via dockerode)", ms(warmStats.p99), ms(coldStats.p99), ""],
          ["exec round trip p50 ms (baseline: raw dockerode exec, same container)", ms(keelExec.p50), ms(rawExec.p50), `<= ${EXEC_RATIO_TARGET}x`],
          ["exec round trip p99 ms (baseline: raw dockerode exec, same container)", ms(keelExec.p99), ms(rawExec.p99), ""],
          ["exec ratio, keel p50 / raw p50", ratio.toFixed(2), "1.00", `<= ${EXEC_RATIO_TARGET}`],
          [`stream into ledger MB/s, median of ${TIMED_STREAMS} (baseline: raw dockerode read)`, stream.keelMbS.toFixed(1), stream.rawMbS.toFixed(1), `>= ${STREAM_TARGET_MB_S}`],
          ["stream ratio, keel / raw read", streamRatio.toFixed(2), "1.00", `>= ${STREAM_RATIO_TARGET}`],
          ["first stream into ledger MB/s, not counted (baseline: raw dockerode read)", stream.firstMbS.toFixed(1), stream.rawMbS.toFixed(1), ""],
          ["stream, output discarded (no ledger) MB/s (baseline: raw dockerode read)", stream.discardMbS.toFixed(1), stream.rawMbS.toFixed(1), ""],
          ["control plane peak RSS MB (baseline: peak before the streams)", stream.peakRssMb.toFixed(1), stream.rssBeforeMb.toFixed(1), ""],
        ],
      ),
      "",
      `stream: ${stream.bytes} bytes in ${stream.observations} observations, ${(stream.keelMs / 1000).toFixed(2)} s through keel (median; ` +
        `the ${TIMED_STREAMS} timed streams ${stream.keelMbSRange.map((v) => v.toFixed(1)).join(", ")} MB/s, the first ${stream.firstMbS.toFixed(1)} MB/s), ` +
        `${(stream.discardMs / 1000).toFixed(2)} s through keel discarding it, ${(stream.rawMs / 1000).toFixed(2)} s raw; every byte found in the observations table`,
      `CPU ms per MB (control plane / agent / postgres / docker engine): through keel ${perMb(stream.keelCpu)} (the first stream ${perMb(stream.firstCpu)}); ` +
        `discarding ${perMb(stream.discardCpu)}; raw read ${perMb(stream.rawCpu)} (the raw read runs in the control-plane process)`,
      `targets: warm p50 <= ${WARM_TARGET_MS} ms ${verdict(warmStats.p50 <= WARM_TARGET_MS)}; ` +
        `exec ratio <= ${EXEC_RATIO_TARGET} ${verdict(ratio <= EXEC_RATIO_TARGET)}; ` +
        `stream >= ${STREAM_TARGET_MB_S} MB/s ${verdict(stream.keelMbS >= STREAM_TARGET_MB_S)}, ` +
        `or its ratio to the raw read >= ${STREAM_RATIO_TARGET} ${verdict(streamRatio >= STREAM_RATIO_TARGET)}`,
      `RESULT mode=${config.durability} warm_p50_ms=${ms(warmStats.p50)} cold_p50_ms=${ms(coldStats.p50)} exec_ratio=${ratio.toFixed(2)} ` +
        `stream_mb_s=${stream.keelMbS.toFixed(1)} stream_ratio=${streamRatio.toFixed(2)} peak_rss_mb=${stream.peakRssMb.toFixed(1)}`,
    ];
    process.stdout.write(`${lines.join("\n")}\n`);
  } finally {
    await agent?.stop();
    await app?.stop();
    await postgres?.stop();
    // Whatever a failure left behind: every container of this run's hosts, by label.
    for (const hostId of Object.values(hosts)) {
      const left = await docker.listContainers({ all: true, filters: { label: [`${LABELS.hostId}=${hostId}`] } }).catch(() => []);
      for (const c of left) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
    }
    await rm(dir, { recursive: true, force: true });
  }
}
