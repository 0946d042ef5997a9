// Sandbox benchmark, on the real Docker engine, each number beside a baseline timed in the same
// run:
//
//   1. Warm-pool acquisition: acquire() on a docker backend whose warm pool (per image) holds
//      started containers, waiting for the pool to refill before each take, so every sample is
//      a warm take. Baseline: create + start of an equally hardened container straight through
//      dockerode (the cold path's floor), removed after each sample.
//   2. Exec round trip: a real Keel (embedded PostgreSQL with default durability, the HTTP/2
//      server on loopback) and a real `keel sandbox-agent` child process (docker backend)
//      attached to it over SandboxService.Attach; one workspace acquired for a run through the
//      dispatcher the exec tools use, then `true` run through it (control plane → Attach stream
//      → agent → docker exec → result back). Baseline: a raw dockerode exec of `true` in the
//      same container (found by its keel.workspace-id label), read to the end and inspected for
//      its exit code. The two are interleaved so drift hits both alike.
//   3. Streaming: an exec printing --stream-mib MiB of `a` (a file written into the workspace
//      untimed, then `cat`) through the dispatcher with the output cap raised above it
//      (KEEL_SANDBOX_MAX_OUTPUT_BYTES), every chunk persisted as observations by the run store's
//      appendObservation (the runner's sink for exec tools), timed until the result is back and
//      the last observation is written; the observations table is checked to hold every byte.
//      Run four times: the first (the process's first large stream, still warming up) is
//      printed but not counted, and the figure is the median of the other three.
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
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { appendFileSync, readdirSync, readFileSync } from "node:fs";
import { chmod, chown, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import type { Duplex } from "node:stream";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import Dockerode from "dockerode";
import pg from "pg";
import { pino } from "pino";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { allowHeapGrowthForStreaming } from "../control-plane/src/heap-growth.js";
import type { ObservationText } from "../control-plane/src/domain/sandbox.js";
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from "../control-plane/src/ledger/embedded-postgres.js";
import { createRunRepository } from "../control-plane/src/ledger/run.repository.js";
import type { SandboxExec, WorkspaceGrant } from "../control-plane/src/tools/sandbox-dispatcher.js";
import { hardenedContainerConfig, LABELS, SANDBOX_USER } from "../sandbox-agent/src/docker/container-config.js";
import { createDemuxer } from "../sandbox-agent/src/docker/demuxer.js";
import { createDockerWorkspaceBackend } from "../sandbox-agent/src/docker/docker-workspace-backend.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceSpec } from "../sandbox-agent/src/workspace-backend.js";
import { freePort, ms, nodeCpuMs, pick, postgresCpuMs, summarize, table } from "./support.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const KEEL_BIN = path.join(ROOT, "bin", "keel.js");
const DEFAULT_IMAGE = "keel/sandbox-base:busybox";
const MiB = 1024 * 1024;
const ATTACH_TIMEOUT_MS = 60_000;
const PROGRESS_EVERY = 25;
const WARM_TARGET_MS = 20;
const EXEC_RATIO_TARGET = 1.3;
const STREAM_TARGET_MB_S = 100;
/** Streams timed after the first one; the figure is their median. */
const TIMED_STREAMS = 3;

interface Options {
  readonly acquisitions: number;
  readonly cold: number;
  readonly poolSize: number;
  readonly execs: number;
  readonly warmup: number;
  readonly streamMib: number;
  readonly image: string;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      acquisitions: { type: "string", default: "30" },
      cold: { type: "string", default: "30" },
      "pool-size": { type: "string", default: "4" },
      execs: { type: "string", default: "100" },
      warmup: { type: "string", default: "10" },
      "stream-mib": { type: "string", default: "64" },
      image: { type: "string", default: DEFAULT_IMAGE },
    },
  });
  const whole = (name: string, value: string, min: number, max: number): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new Error(`--${name} must be an integer from ${min} to ${max}, not ${JSON.stringify(value)}`);
    return n;
  };
  return {
    acquisitions: whole("acquisitions", values.acquisitions, 1, 10_000),
    cold: whole("cold", values.cold, 1, 10_000),
    poolSize: whole("pool-size", values["pool-size"], 1, 100),
    execs: whole("execs", values.execs, 1, 100_000),
    warmup: whole("warmup", values.warmup, 0, 10_000),
    // The control plane's output cap tops out at 256 MiB (KEEL_SANDBOX_MAX_OUTPUT_BYTES).
    streamMib: whole("stream-mib", values["stream-mib"], 1, 255),
    image: values.image,
  };
}

const delay = (millis: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, millis));
/** Lifetime peak resident set of this process, in MiB (maxRSS is in KiB). */
const peakRssMb = (): number => process.resourceUsage().maxRSS / 1024;

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
    progress(`starting embedded PostgreSQL in ${dir} (default durability: fsync and synchronous_commit on)`);
    postgres = await startEmbeddedPostgres({ dataDir: path.join(dir, "data"), port: await freePort() });
    const streamBytes = options.streamMib * MiB;
    const env = {
      DATABASE_URL: postgres.url,
      KEEL_LOG_LEVEL: "warn",
      // The whole stream must fit under the cap; the cap's own maximum is 256 MiB.
      KEEL_SANDBOX_MAX_OUTPUT_BYTES: String(Math.min(256 * MiB, streamBytes + MiB)),
      ...pick(process.env, ["KEEL_DB_POOL_MAX"]),
    };
    const config = loadConfig(env);
    app = await buildApp(config, env, { log: pino({ level: "warn" }, pino.destination(2)) });
    const { secret: token } = await app.tokens.create("sandbox-host", "bench");
    const { url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
    const agentDir = path.join(dir, "agent");
    agent = startAgent({ url, token, hostId: hosts.agent, dataDir: agentDir, image: options.image });
    await waitAttached(app, agent, hosts.agent);
    progress(`keel on ${url}; sandbox agent ${hosts.agent} (pid ${agent.child.pid ?? "?"}, docker backend) attached`);

    const dispatcher = app.sandbox.dispatcher;
    const runId = randomUUID();
    const grant: WorkspaceGrant = { runId, agentId: "sandbox-bench", image: options.image, labels: [], networkAccess: false, secrets: {} };
    const acquireStarted = performance.now();
    const workspaceId = await dispatcher.workspaceFor(grant, AbortSignal.timeout(120_000));
    progress(`workspace ${workspaceId} acquired through the dispatcher in ${ms(performance.now() - acquireStarted)} ms`);
    const found = await docker.listContainers({ filters: { label: [`${LABELS.workspaceId}=${workspaceId}`, `${LABELS.hostId}=${hosts.agent}`] } });
    if (found.length !== 1 || found[0] === undefined) throw new Error(`expected one running container labelled ${LABELS.workspaceId}=${workspaceId}, found ${found.length}`);
    const container = docker.getContainer(found[0].Id);

    const exec = await execPhase(dispatcher, workspaceId, container, config.sandbox.maxOutputBytes, options, progress);

    const db = new pg.Client({ connectionString: postgres.url });
    await db.connect();
    let stream: StreamPhase;
    try {
      const store = createRunRepository(app.ledger.sql, { maxConcurrentRootRuns: config.maxConcurrentRootRuns });
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
        (invocationId, seq, streamName, text) => store.appendObservation(runId, invocationId, seq, streamName, text),
        progress,
      );
    } finally {
      await db.end();
    }
    await dispatcher.releaseRun(runId).catch((error: unknown) => progress(`releasing the workspace failed: ${String(error)}`));

    const warmStats = summarize(warm);
    const coldStats = summarize(cold);
    const keelExec = summarize(exec.keel);
    const rawExec = summarize(exec.raw);
    const ratio = keelExec.p50 / rawExec.p50;
    const verdict = (ok: boolean) => (ok ? "met" : "MISSED");
    const perMb = (lap: CpuLap) =>
      [lap.controlPlane, lap.agent, lap.postgres, lap.docker].map((msSpent) => (msSpent / options.streamMib).toFixed(1)).join(" / ");
    const lines = [
      "",
      `sandbox: image ${options.image}; warm pool of ${options.poolSize}, ${warm.length} warm takes vs ${cold.length} cold create+start; ` +
        `${exec.keel.length} exec round trips of \`true\` each way (interleaved, ${options.warmup} warm-up each not counted); ` +
        `${TIMED_STREAMS + 1} stdout streams of ${options.streamMib} MiB each, the first not counted; embedded PostgreSQL 17 (${stream.settings}); MB = MiB`,
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
        `stream >= ${STREAM_TARGET_MB_S} MB/s ${verdict(stream.keelMbS >= STREAM_TARGET_MB_S)}`,
      `RESULT warm_p50_ms=${ms(warmStats.p50)} cold_p50_ms=${ms(coldStats.p50)} exec_ratio=${ratio.toFixed(2)} ` +
        `stream_mb_s=${stream.keelMbS.toFixed(1)} peak_rss_mb=${stream.peakRssMb.toFixed(1)}`,
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

// ---------------------------------------------------------------------------------------------
// 1. Warm-pool acquisition, and its baseline: a cold, equally hardened create + start

async function warmPhase(docker: Dockerode, hostId: string, workspaceRoot: string, options: Options, progress: (line: string) => void): Promise<number[]> {
  const backend = createDockerWorkspaceBackend({
    docker,
    hostId,
    workspaceRoot,
    warmPool: [{ image: options.image, size: options.poolSize }],
    log: (line) => progress(`docker backend: ${line}`),
  });
  const idle = () => backend.poolStatus()[0]?.idle ?? 0;
  const samples: number[] = [];
  try {
    progress(`filling a warm pool of ${options.poolSize} for ${options.image}`);
    const warmup = Math.min(2, options.warmup);
    for (let i = 0; i < warmup + options.acquisitions; i++) {
      // Every take finds a full pool: the refill after the previous take has finished.
      await backend.poolsFilled();
      if (idle() !== options.poolSize) throw new Error(`the warm pool holds ${idle()} of ${options.poolSize} containers; its refill failed (see the log above)`);
      const spec: WorkspaceSpec = {
        workspaceId: randomUUID(),
        runId: randomUUID(),
        image: options.image,
        networkAccess: false,
        env: {},
        limits: DEFAULT_WORKSPACE_LIMITS,
      };
      const started = performance.now();
      await backend.acquire(spec, AbortSignal.timeout(120_000));
      const elapsed = performance.now() - started;
      // The refill pushes a new container only once it runs: one fewer idle means a warm take.
      if (idle() !== options.poolSize - 1) throw new Error(`acquisition ${i} was not served from the warm pool (idle ${idle()} of ${options.poolSize})`);
      if (i >= warmup) samples.push(elapsed);
      await backend.release(spec.workspaceId);
      if (samples.length > 0 && (samples.length % 10 === 0 || samples.length === options.acquisitions)) {
        const recent = summarize(samples.slice(-10));
        progress(`warm acquire ${samples.length}/${options.acquisitions}; last ${Math.min(10, samples.length)}: p50 ${ms(recent.p50)} ms, p99 ${ms(recent.p99)} ms`);
      }
    }
  } finally {
    await backend.close();
  }
  return samples;
}

async function coldPhase(docker: Dockerode, hostId: string, root: string, options: Options, progress: (line: string) => void): Promise<number[]> {
  const samples: number[] = [];
  const warmup = Math.min(2, options.warmup);
  for (let i = 0; i < warmup + options.cold; i++) {
    // The folder is made outside the timed part: the baseline is dockerode's create + start alone.
    const folder = path.join(root, `w${i}`);
    await mkdir(folder, { recursive: true, mode: 0o700 });
    await chown(folder, SANDBOX_USER.uid, SANDBOX_USER.gid);
    const started = performance.now();
    // The backend's own container config, so the baseline cannot drift from what it creates.
    const container = await docker.createContainer(
      hardenedContainerConfig({
        image: options.image,
        limits: DEFAULT_WORKSPACE_LIMITS,
        networkAccess: false,
        hostFolder: folder,
        hostId,
        workspaceLabel: `cold-${i}`,
        runId: "",
        warm: false,
      }),
    );
    try {
      await container.start();
      if (i >= warmup) samples.push(performance.now() - started);
    } finally {
      await container.remove({ force: true });
    }
    if (samples.length > 0 && (samples.length % 10 === 0 || samples.length === options.cold)) {
      const recent = summarize(samples.slice(-10));
      progress(`cold create+start ${samples.length}/${options.cold}; last ${Math.min(10, samples.length)}: p50 ${ms(recent.p50)} ms, p99 ${ms(recent.p99)} ms`);
    }
  }
  return samples;
}

// ---------------------------------------------------------------------------------------------
// The sandbox agent child process

interface AgentChild {
  readonly child: ChildProcess;
  /** Its last output lines, for error messages. */
  readonly output: string[];
  stop(): Promise<void>;
}

function startAgent(options: { url: string; token: string; hostId: string; dataDir: string; image: string }): AgentChild {
  const child = spawn(
    process.execPath,
    [
      ...(process.env["KEEL_BENCH_AGENT_NODE_ARGS"]?.split(" ").filter(Boolean) ?? []),
      KEEL_BIN,
      "sandbox-agent",
      "--control-plane",
      options.url,
      "--host-id",
      options.hostId,
      "--data-dir",
      options.dataDir,
      "--capacity",
      "4",
      "--backend",
      "docker",
      "--image",
      options.image,
    ],
    // The token through the environment, as an operator would pass it.
    { cwd: ROOT, env: { ...process.env, KEEL_SANDBOX_TOKEN: options.token, KEEL_LOG_LEVEL: "warn" }, stdio: ["ignore", "pipe", "pipe"] },
  );
  const output: string[] = [];
  const logFile = process.env["KEEL_BENCH_AGENT_LOG"];
  const keep = (line: string) => {
    if (logFile !== undefined && logFile !== "") appendFileSync(logFile, `${Date.now()} ${line}\n`);
    output.push(line);
    if (output.length > 40) output.shift();
  };
  createInterface({ input: child.stdout! }).on("line", keep);
  createInterface({ input: child.stderr! }).on("line", keep);
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", () => resolve());
  });
  return {
    child,
    output,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function waitAttached(app: KeelApp, agent: AgentChild, hostId: string): Promise<void> {
  const deadline = Date.now() + ATTACH_TIMEOUT_MS;
  while (!app.sandbox.hub.isAttached(hostId)) {
    if (agent.child.exitCode !== null || agent.child.signalCode !== null) {
      throw new Error(`the sandbox agent exited (${agent.child.exitCode ?? agent.child.signalCode}) before attaching; its output:\n${agent.output.join("\n")}`);
    }
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`the sandbox agent did not attach within ${ATTACH_TIMEOUT_MS / 1000} s; its output:\n${agent.output.join("\n")}`);
    await app.sandbox.hub.changed(Math.min(left, 250), AbortSignal.timeout(left));
  }
}

// ---------------------------------------------------------------------------------------------
// Raw dockerode exec: the baseline for 2 and 3

/** Counts the payload bytes of Docker's multiplexed stream with the backend's own demuxer. */
function payloadCounter(): { feed(chunk: Buffer): void; readonly bytes: number } {
  let bytes = 0;
  const feed = createDemuxer((_stream, chunk) => {
    bytes += chunk.length;
  });
  return {
    feed,
    get bytes() {
      return bytes;
    },
  };
}

/** Creates, starts and reads an exec to its end, then inspects it for its exit code (polling, as the engine may lag the stream). */
async function rawExec(container: Dockerode.Container, cmd: readonly string[]): Promise<{ exitCode: number | null; bytes: number }> {
  const exec = await container.exec({ Cmd: [...cmd], AttachStdin: false, AttachStdout: true, AttachStderr: true, Tty: false });
  const stream: Duplex = await exec.start({ hijack: true, stdin: false });
  const counter = payloadCounter();
  try {
    await new Promise<void>((resolve, reject) => {
      stream.on("data", (chunk: Buffer) => counter.feed(chunk));
      stream.once("end", resolve);
      stream.once("close", resolve);
      stream.once("error", reject);
    });
  } finally {
    stream.destroy();
  }
  for (let step = 2; ; step = Math.min(step * 2, 50)) {
    const info = await exec.inspect();
    if (!info.Running) return { exitCode: info.ExitCode, bytes: counter.bytes };
    await delay(step);
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Exec round trip through control plane and agent, against raw dockerode

interface ExecPhase {
  readonly keel: number[];
  readonly raw: number[];
}

async function execPhase(
  dispatcher: KeelApp["sandbox"]["dispatcher"],
  workspaceId: string,
  container: Dockerode.Container,
  maxOutputBytes: number,
  options: Options,
  progress: (line: string) => void,
): Promise<ExecPhase> {
  const argv = ["true"];
  const command: SandboxExec = { argv, workingDirectory: "/workspace", env: {}, timeoutMs: 30_000, maxOutputBytes };
  const viaKeel = async (): Promise<number> => {
    const started = performance.now();
    const result = await dispatcher.exec(workspaceId, randomUUID(), command, async () => {}, AbortSignal.timeout(60_000));
    const elapsed = performance.now() - started;
    if (result.exitCode !== 0 || result.timedOut) throw new Error(`exec through keel ended with exit code ${result.exitCode}${result.timedOut ? " (timed out)" : ""}`);
    return elapsed;
  };
  const viaDocker = async (): Promise<number> => {
    const started = performance.now();
    const { exitCode } = await rawExec(container, argv);
    const elapsed = performance.now() - started;
    if (exitCode !== 0) throw new Error(`raw exec ended with exit code ${exitCode ?? "none"}`);
    return elapsed;
  };

  for (let i = 0; i < options.warmup; i++) {
    await viaKeel();
    await viaDocker();
  }
  if (options.warmup > 0) progress(`exec warm-up: ${options.warmup} round trips each way`);
  const keel: number[] = [];
  const raw: number[] = [];
  for (let i = 0; i < options.execs; i++) {
    keel.push(await viaKeel());
    raw.push(await viaDocker());
    if ((i + 1) % PROGRESS_EVERY === 0 || i + 1 === options.execs) {
      const k = summarize(keel.slice(-PROGRESS_EVERY));
      const r = summarize(raw.slice(-PROGRESS_EVERY));
      progress(`exec ${i + 1}/${options.execs}; last ${Math.min(PROGRESS_EVERY, keel.length)}: keel p50 ${ms(k.p50)} ms, raw p50 ${ms(r.p50)} ms`);
    }
  }
  return { keel, raw };
}

// ---------------------------------------------------------------------------------------------
// 3. Observation streaming into the ledger, against a raw dockerode read of the same output

interface StreamPhase {
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

/** CPU time (ms) each party spent in one timed section. */
interface CpuLap {
  readonly controlPlane: number;
  readonly agent: number;
  readonly postgres: number;
  readonly docker: number;
}

/** The clock ticks (user + system) a process has used, from /proc; 0 where there is none (not Linux, or it exited). */
function processTicks(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(fields[11]) + Number(fields[12]);
  } catch {
    return 0;
  }
}

/** The Docker engine's processes (the engine and the shims that carry exec output): their pids. */
function dockerPids(): number[] {
  try {
    return readdirSync("/proc")
      .filter((entry) => /^\d+$/.test(entry))
      .filter((entry) => {
        try {
          const comm = readFileSync(`/proc/${entry}/comm`, "utf8").trim();
          return comm === "dockerd" || comm === "containerd" || comm.startsWith("containerd-shim");
        } catch {
          return false;
        }
      })
      .map(Number);
  } catch {
    return [];
  }
}

/**
 * Splits the CPU a stream costs between this process (the control plane), the agent, PostgreSQL
 * and the Docker engine: a diagnostic beside the throughput, since on a shared machine CPU per MB
 * is steadier than wall time. Linux only (zeros elsewhere).
 */
function cpuMeter(target: { agentPid: number | undefined; postgresDataDir: string }): { lap(): CpuLap } {
  const docker = dockerPids();
  const read = () => ({
    controlPlane: nodeCpuMs(),
    agent: target.agentPid === undefined ? 0 : processTicks(target.agentPid) * 10,
    postgres: postgresCpuMs(target.postgresDataDir),
    docker: new Map(docker.map((pid) => [pid, processTicks(pid) * 10])),
  });
  let last = read();
  return {
    lap() {
      const now = read();
      let dockerMs = 0;
      // Only processes seen at both ends: a shim that exited meanwhile reads 0, not minus its total.
      for (const [pid, spent] of now.docker) if (spent > 0 && (last.docker.get(pid) ?? 0) > 0) dockerMs += spent - last.docker.get(pid)!;
      const lap = {
        controlPlane: now.controlPlane - last.controlPlane,
        agent: now.agent - last.agent,
        postgres: now.postgres - last.postgres,
        docker: dockerMs,
      };
      last = now;
      return lap;
    },
  };
}

/**
 * With KEEL_BENCH_PROFILE_DIR set, a CPU profile of this process (the control plane) over one
 * timed stream only (through keel, or discarding), written there as <name>-<time>.cpuprofile.
 */
async function startProfile(name: string): Promise<{ stop(progress: (line: string) => void): Promise<void> } | undefined> {
  const dir = process.env["KEEL_BENCH_PROFILE_DIR"];
  if (dir === undefined || dir === "") return undefined;
  const { Session } = await import("node:inspector/promises");
  const session = new Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.start");
  return {
    async stop(progress) {
      const { profile } = await session.post("Profiler.stop");
      session.disconnect();
      await mkdir(dir, { recursive: true });
      const file = path.join(dir, `${name}-${Date.now()}.cpuprofile`);
      await writeFile(file, JSON.stringify(profile));
      progress(`CPU profile (${name}): ${file}`);
    },
  };
}

async function streamPhase(
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
  persist: (invocationId: string, seq: number, stream: string, text: ObservationText) => Promise<void>,
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
  /** One stream through keel into the observations table, checked byte for byte afterwards. */
  const throughKeel = async (label: string): Promise<{ ms: number; cpu: CpuLap; observations: number }> => {
    const invocationId = randomUUID();
    let seq = 0;
    progress(`${label}: streaming ${streamBytes / MiB} MiB through keel into the observations table (output cap ${target.maxOutputBytes} bytes)`);
    const profile = await startProfile("stream");
    const cpu = cpuMeter(target.cpu);
    const started = performance.now();
    const result = await dispatcher.exec(
      workspaceId,
      invocationId,
      { argv, workingDirectory: "/workspace", env: {}, timeoutMs: 600_000, maxOutputBytes: target.maxOutputBytes },
      (stream, text) => persist(invocationId, ++seq, stream, text),
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

