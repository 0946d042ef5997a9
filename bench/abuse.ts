// Abuse benchmark (issue #12, item 5): what clients without a valid token cost an authorized
// one. A real Keel (embedded PostgreSQL, the HTTP/2 server on loopback, in-process workers);
// an authorized connector sends SubmitMessage at a steady pace and its latency is measured
// idle, then while a separate attacker process (bench/abuse-flood.ts) floods unauthenticated
// 4 MiB uploads, calls with random tokens at --rate per second (a third each of no Keel shape, the
// issued shape with a made-up tag, and the untagged shape of older secrets), and both. The phases take turns
// in --rounds slices, each measured only once its attacker is up, after an unmeasured warm-up
// round of every phase. Printed side by side with the ratio to idle (target: p99 under 2x), the
// attack rates the server met, and its RSS.
// With two CPUs or more the server side and the attacker are pinned to different CPUs (--pin),
// as a remote attacker would not share the server's cores; the header says what ran where.
//
//   npm run bench -- abuse [--seconds 30] [--rate 5000] [--uploaders 8] [--pace-ms 20] [--rounds 3] [--durability strict|relaxed] [--pin auto|on|off] [--profile DIR]
import { monitorEventLoopDelay, performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { MAX_UNAUTHENTICATED_PER_CONNECTION } from "../control-plane/src/api/auth-gate.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { startAttack, type AttackMode, type RunningAttack } from "./abuse/attacker.js";
import { pinForAbuse } from "./abuse/pinning.js";
import { phaseProfiler, type PhaseProfiler } from "./abuse/profile.js";
import { benchDurability, DURABILITY_OPTION, ms, nodeCpuMs, postgresCpuMs, startBenchKeel, summarize, table, withBenchPostgres, type Stats, verdict, BenchUsageError } from "./support.js";

const MIB = 1024 * 1024;
const CONNECTOR = "abuse-bench";
/** Unmeasured time between slices. */
const SETTLE_MS = 1_000;
/** Each phase's unmeasured warm-up before the measured rounds. */
const WARM_UP_MS = 2_000;

interface Options {
  readonly seconds: number;
  readonly rate: number;
  readonly uploaders: number;
  readonly paceMs: number;
  /** Each phase's time is split into this many slices, the phases taking turns. */
  readonly rounds: number;
  /** A folder for one CPU profile of this process per phase. */
  readonly profile: string | undefined;
  readonly pin: "auto" | "on" | "off";
}

function parseOptions(args: readonly string[]): Options & { durability: string | undefined } {
  const { values } = parseArgs({
    args: [...args],
    options: {
      seconds: { type: "string", default: "30" },
      rate: { type: "string", default: "5000" },
      uploaders: { type: "string", default: "8" },
      "pace-ms": { type: "string", default: "20" },
      rounds: { type: "string", default: "3" },
      profile: { type: "string" },
      pin: { type: "string", default: "auto" },
      ...DURABILITY_OPTION,
    },
  });
  const positive = (name: string, value: string, min: number): number => {
    const n = Number(value);
    if (!Number.isFinite(n) || n < min) throw new BenchUsageError(`--${name} must be a number >= ${min}, not ${JSON.stringify(value)}`);
    return n;
  };
  return {
    seconds: positive("seconds", values.seconds, 1),
    rate: positive("rate", values.rate, 0),
    uploaders: positive("uploaders", values.uploaders, 0),
    paceMs: positive("pace-ms", values["pace-ms"], 1),
    rounds: Math.floor(positive("rounds", values.rounds, 1)),
    profile: values.profile,
    pin: pinMode(values.pin),
    durability: values.durability,
  };
}

function pinMode(value: string): Options["pin"] {
  if (value !== "auto" && value !== "on" && value !== "off") throw new BenchUsageError(`--pin must be auto, on or off, not ${JSON.stringify(value)}`);
  return value;
}

interface Phase {
  readonly name: string;
  readonly mode: AttackMode | undefined;
  readonly latencies: number[];
  rssPeakBytes: number;
  /** Milliseconds measured, over all its slices. */
  measuredMs: number;
  /** CPU milliseconds this process (Keel and its authorized client) and PostgreSQL used meanwhile. */
  keelCpuMs: number;
  postgresCpuMs: number;
  /** This process's event-loop delay, p99 over its slices' samples (ms). */
  loopDelayP99Ms: number[];
  attacker: Record<string, number> | undefined;
}

function addCounts(into: Record<string, number> | undefined, counts: Record<string, number>): Record<string, number> {
  const sum = { ...into };
  for (const [key, value] of Object.entries(counts)) sum[key] = (sum[key] ?? 0) + value;
  return sum;
}

export default async function abuse(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const durability = benchDurability(options.durability);
  const progress = (line: string) => process.stderr.write(`[abuse] ${line}\n`);
  // Before PostgreSQL starts, so that it inherits the server's CPU.
  const pinning = pinForAbuse(options.pin);
  progress(pinning.describe);

  await withBenchPostgres("abuse", progress, async (postgres) => {
    const { app, config, url } = await startBenchKeel(postgres, DEMO_AGENT, durability);
    const profiler: PhaseProfiler | undefined = options.profile === undefined ? undefined : phaseProfiler(options.profile);
    try {
      // A token scoped to the connector this bench speaks as, as a deployment would issue it.
      const { secret: token } = await app.tokens.create("connector", "abuse-bench", { scope: { kind: "connector", connectors: [CONNECTOR], agents: "any" } });
      progress(`keel on ${url}: ${config.workers} workers, durability=${durability}; attacker: ${options.rate}/s random tokens, ${options.uploaders} upload lanes`);
      const bearer: Interceptor = (next) => (request) => {
        request.header.set("authorization", `Bearer ${token}`);
        return next(request);
      };
      const ingress = createClient(IngressService, createGrpcTransport({ baseUrl: url, interceptors: [bearer] }));
      let sequence = 0;
      const submitOne = async (): Promise<number> => {
        const i = sequence++;
        const started = performance.now();
        await ingress.submitMessage({
          agentId: DEMO_AGENT.id,
          conversationId: `abuse-${i % 200}`,
          actor: { id: "bench-user", displayName: "Bench User" },
          messageId: `abuse-message-${i}`,
          text: `benchmark message ${i}`,
          connector: CONNECTOR,
        });
        return performance.now() - started;
      };
      const attackSettings = { url, rate: options.rate, uploaders: options.uploaders, perConnection: MAX_UNAUTHENTICATED_PER_CONNECTION, prefix: pinning.attackerPrefix };
      /** The authorized client, one call every paceMs for `ms`, while sampling RSS into `phase`. */
      const measure = async (phase: Phase, ms: number, label: string): Promise<void> => {
        // The last slice's attacker cut all its connections at once as it left; the server's work
        // on that burst belongs to no phase, so it is let pass before this one starts.
        await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
        const attack: RunningAttack | undefined = phase.mode === undefined ? undefined : await startAttack(phase.mode, attackSettings);
        const stopProfile = await profiler?.start();
        const sampler = setInterval(() => (phase.rssPeakBytes = Math.max(phase.rssPeakBytes, process.memoryUsage().rss)), 100);
        const started = performance.now();
        const [keelCpu, postgresCpu] = [nodeCpuMs(), postgresCpuMs(postgres.dataDir)];
        const loopDelay = monitorEventLoopDelay({ resolution: 10 });
        loopDelay.enable();
        const before = phase.latencies.length;
        try {
          while (performance.now() < started + ms) {
            const next = performance.now() + options.paceMs;
            phase.latencies.push(await submitOne());
            const wait = next - performance.now();
            if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
          }
        } finally {
          clearInterval(sampler);
          phase.measuredMs += performance.now() - started;
          phase.keelCpuMs += nodeCpuMs() - keelCpu;
          phase.postgresCpuMs += postgresCpuMs(postgres.dataDir) - postgresCpu;
          loopDelay.disable();
          phase.loopDelayP99Ms.push(loopDelay.percentile(99) / 1e6);
        }
        const profile = stopProfile === undefined ? undefined : await stopProfile(label);
        const counts = attack === undefined ? undefined : await attack.stop();
        if (counts !== undefined) phase.attacker = addCounts(phase.attacker, counts);
        const rss = (process.memoryUsage().rss / MIB).toFixed(0);
        progress(`${label}: ${phase.latencies.length - before} calls, RSS ${rss} MiB${counts === undefined ? "" : `; attacker ${JSON.stringify(counts)}`}`);
        if (profile !== undefined) progress(profile);
      };

      const phase = (name: string, mode: AttackMode | undefined): Phase => ({ name, mode, latencies: [], rssPeakBytes: 0, measuredMs: 0, attacker: undefined, keelCpuMs: 0, postgresCpuMs: 0, loopDelayP99Ms: [] });
      const phases = [
        phase("idle", undefined),
        // The control: the attacker's CPU busy and no traffic. What it costs the authorized client
        // is the machine's (other work moved onto the server's CPU), not the server's.
        phase("control: attacker CPU busy, no calls", "spin"),
        phase("4 MiB unauthenticated uploads", "uploads"),
        phase(`${options.rate}/s random-token calls`, "tokens"),
        phase("both at once", "both"),
      ];
      // An unmeasured round first, every phase for WARM_UP_MS: the first time the server meets an
      // attack its refusal paths run unoptimized and its heap grows, which no later slice repeats.
      for (const p of phases) await measure(phase(`warm-up: ${p.name}`, p.mode), WARM_UP_MS, `warm-up: ${p.name}`);
      const rssBefore = process.memoryUsage().rss;
      // Interleaved slices: a busy machine's noise falls on every phase alike, not on whichever
      // phase happened to run while something else did.
      const sliceMs = (options.seconds * 1000) / options.rounds;
      for (let round = 1; round <= options.rounds; round++) {
        for (const p of phases) await measure(p, sliceMs, `${p.name} (round ${round}/${options.rounds})`);
      }
      const rssAfter = process.memoryUsage().rss;

      const idle = summarize(phases[0]!.latencies);
      // Keel's CPU per authorized call when idle; what a phase used beyond that, per unauthenticated
      // call sent (answered, reset, or cut with its connection; answers are paced, so not every
      // call gets one), is what such a call costs: an estimate that holds on a busy machine, unlike latency.
      const idleCpuPerCall = phases[0]!.keelCpuMs / Math.max(phases[0]!.latencies.length, 1);
      const perRefusal = (p: Phase) => {
        const sent = count(p, "uploadsSent", "tokenCallsSent");
        return sent === 0 ? "-" : (((p.keelCpuMs - p.latencies.length * idleCpuPerCall) * 1000) / sent).toFixed(0);
      };
      const count = (p: Phase, ...keys: string[]) => keys.reduce((sum, key) => sum + (p.attacker?.[key] ?? 0), 0);
      const perSecond = (p: Phase, ...keys: string[]) => (p.attacker === undefined ? "-" : ((count(p, ...keys) * 1000) / p.measuredMs).toFixed(0));
      const results = phases.map((p) => ({ p, stats: summarize(p.latencies) }));
      const rows = results.map(({ p, stats }: { p: Phase; stats: Stats }) => [
        p.name,
        String(stats.n),
        ms(stats.p50),
        ms(stats.p99),
        `${(stats.p99 / idle.p99).toFixed(2)}x`,
        (p.rssPeakBytes / MIB).toFixed(0),
        `${((p.keelCpuMs / p.measuredMs) * 100).toFixed(0)}%`,
        `${((p.postgresCpuMs / p.measuredMs) * 100).toFixed(0)}%`,
        Math.max(...p.loopDelayP99Ms).toFixed(0),
        perRefusal(p),
        perSecond(p, "uploadsSent", "tokenCallsSent"),
        perSecond(p, "uploadsRefused", "tokenCallsRefused"),
        perSecond(p, "uploadsReset"),
        perSecond(p, "callsLostToGoaway"),
        perSecond(p, "tokenCallsOther"),
        perSecond(p, "connections"),
      ]);
      const lines = [
        `SubmitMessage latency of an authorized connector (ms), one call every ${options.paceMs} ms, ${options.seconds} s per phase in ${options.rounds} interleaved rounds after a ${WARM_UP_MS / 1000} s unmeasured warm-up of each`,
        `CPUs: ${pinning.describe}`,
        `attacker: ${options.rate} random-token calls/s (a third each: no Keel shape, issued shape with a made-up tag, untagged older shape) on ${MAX_UNAUTHENTICATED_PER_CONNECTION} calls per connection (the server's limit), ${options.uploaders} connections of 8 concurrent 4 MiB uploads`,
        "loop p99: worst slice's event-loop delay p99 (ms); µs/call: Keel CPU beyond its idle cost per authorized call, per unauthenticated call sent",
        "attacker columns, per second: calls sent; answered Unauthenticated; reset before an answer; unanswered as the server shed their connection; other outcomes; connections opened",
        "",
        ...table(["phase", "calls", "p50", "p99", "p99/idle", "peak RSS MiB", "Keel CPU", "PG CPU", "loop p99", "µs/call", "sent/s", "refused/s", "reset/s", "shed/s", "other/s", "conns/s"], rows),
        "",
        `server RSS before the attacks ${(rssBefore / MIB).toFixed(0)} MiB, after ${(rssAfter / MIB).toFixed(0)} MiB`,
      ];
      process.stdout.write(`${lines.join("\n")}\n`);
      const worst = Math.max(...results.slice(2).map(({ stats }) => stats.p99 / idle.p99));
      process.stdout.write(`target: authorized p99 under every attack < 2x idle (worst is ${worst.toFixed(2)}x) ${verdict(worst < 2)}\n`);
      process.stdout.write(
        `RESULT abuse idle_p99_ms=${ms(idle.p99)} worst_p99_ratio=${worst.toFixed(2)} target_ratio=2 ` +
          `rss_before_mib=${(rssBefore / MIB).toFixed(0)} rss_after_mib=${(rssAfter / MIB).toFixed(0)}\n`,
      );
    } finally {
      profiler?.close();
      await app.stop();
    }
  });
}
