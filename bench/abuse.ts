// Abuse benchmark (issue #12, item 5): what clients without a valid token cost an authorized
// one. A real Keel (embedded PostgreSQL, the HTTP/2 server on loopback, in-process workers);
// an authorized connector sends SubmitMessage at a steady pace and its latency is measured
// idle, then while a separate attacker process (bench/abuse-flood.ts) floods unauthenticated
// 4 MiB uploads, calls with random tokens at --rate per second, and both. Printed side by
// side with the ratio to idle (target: p99 under 2x), and the server's RSS before and after.
//
//   npm run bench -- abuse [--seconds 10] [--rate 5000] [--uploaders 8] [--pace-ms 20] [--durability strict|relaxed]
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { benchDurability, DURABILITY_OPTION, ms, startBenchKeel, summarize, table, withBenchPostgres, type Stats } from "./support.js";

const FLOOD_SCRIPT = fileURLToPath(new URL("./abuse-flood.ts", import.meta.url));
const MIB = 1024 * 1024;
const CONNECTOR = "abuse-bench";

interface Options {
  readonly seconds: number;
  readonly rate: number;
  readonly uploaders: number;
  readonly paceMs: number;
}

function parseOptions(args: readonly string[]): Options & { durability: string | undefined } {
  const { values } = parseArgs({
    args: [...args],
    options: {
      seconds: { type: "string", default: "10" },
      rate: { type: "string", default: "5000" },
      uploaders: { type: "string", default: "8" },
      "pace-ms": { type: "string", default: "20" },
      ...DURABILITY_OPTION,
    },
  });
  const positive = (name: string, value: string, min: number): number => {
    const n = Number(value);
    if (!Number.isFinite(n) || n < min) throw new Error(`--${name} must be a number >= ${min}, not ${JSON.stringify(value)}`);
    return n;
  };
  return {
    seconds: positive("seconds", values.seconds, 1),
    rate: positive("rate", values.rate, 0),
    uploaders: positive("uploaders", values.uploaders, 0),
    paceMs: positive("pace-ms", values["pace-ms"], 1),
    durability: values.durability,
  };
}

interface Phase {
  readonly name: string;
  readonly stats: Stats;
  readonly rssPeakBytes: number;
  readonly attacker: Record<string, number> | undefined;
}

/** Runs the attacker for `seconds`; resolves with its counts. */
function attack(url: string, mode: "uploads" | "tokens" | "both", options: Options): Promise<Record<string, number>> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", FLOOD_SCRIPT, url, mode, String(options.seconds), String(options.rate), String(options.uploaders)], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    child.on("error", reject);
    child.on("exit", (code) => {
      try {
        if (code !== 0) throw new Error(`the attacker exited with ${code}`);
        resolve(JSON.parse(out.trim().split("\n").pop() ?? "{}") as Record<string, number>);
      } catch (error) {
        reject(error instanceof Error ? error : new Error(String(error)));
      }
    });
  });
}

export default async function abuse(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const durability = benchDurability(options.durability);
  const progress = (line: string) => process.stderr.write(`[abuse] ${line}\n`);

  await withBenchPostgres("abuse", progress, async (postgres) => {
    const { app, config, url } = await startBenchKeel(postgres, DEMO_AGENT, durability);
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
      /** The authorized client, one call every paceMs for `seconds`, while sampling RSS. */
      const measure = async (name: string, during?: Promise<Record<string, number>>): Promise<Phase> => {
        const latencies: number[] = [];
        let rssPeakBytes = process.memoryUsage().rss;
        const sampler = setInterval(() => (rssPeakBytes = Math.max(rssPeakBytes, process.memoryUsage().rss)), 100);
        const until = performance.now() + options.seconds * 1000;
        try {
          while (performance.now() < until) {
            const next = performance.now() + options.paceMs;
            latencies.push(await submitOne());
            const wait = next - performance.now();
            if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
          }
          const attacker = during === undefined ? undefined : await during;
          progress(`${name}: ${latencies.length} calls${attacker === undefined ? "" : `; attacker ${JSON.stringify(attacker)}`}`);
          return { name, stats: summarize(latencies), rssPeakBytes, attacker };
        } finally {
          clearInterval(sampler);
        }
      };

      await measure("warm-up");
      const rssBefore = process.memoryUsage().rss;
      const phases: Phase[] = [await measure("idle")];
      phases.push(await measure("4 MiB unauthenticated uploads", attack(url, "uploads", options)));
      phases.push(await measure(`${options.rate}/s random-token calls`, attack(url, "tokens", options)));
      phases.push(await measure("both at once", attack(url, "both", options)));
      const rssAfter = process.memoryUsage().rss;

      const idle = phases[0]!.stats;
      const rows = phases.map((phase) => [
        phase.name,
        String(phase.stats.n),
        ms(phase.stats.p50),
        ms(phase.stats.p99),
        `${(phase.stats.p99 / idle.p99).toFixed(2)}x`,
        (phase.rssPeakBytes / MIB).toFixed(0),
        phase.attacker === undefined ? "-" : String((phase.attacker["uploadsRefused"] ?? 0) + (phase.attacker["tokenCallsRefused"] ?? 0)),
        phase.attacker === undefined ? "-" : String(phase.attacker["uploadsReset"] ?? 0),
      ]);
      const lines = [
        `SubmitMessage latency of an authorized connector (ms), one call every ${options.paceMs} ms for ${options.seconds} s per phase`,
        "",
        ...table(["phase", "calls", "p50", "p99", "p99/idle", "peak RSS MiB", "unauthenticated", "reset"], rows),
        "",
        `server RSS before the attacks ${(rssBefore / MIB).toFixed(0)} MiB, after ${(rssAfter / MIB).toFixed(0)} MiB`,
      ];
      process.stdout.write(`${lines.join("\n")}\n`);
      const worst = Math.max(...phases.slice(1).map((phase) => phase.stats.p99 / idle.p99));
      process.stdout.write(
        `RESULT abuse idle_p99_ms=${ms(idle.p99)} worst_p99_ratio=${worst.toFixed(2)} target_ratio=2 ` +
          `rss_before_mib=${(rssBefore / MIB).toFixed(0)} rss_after_mib=${(rssAfter / MIB).toFixed(0)}\n`,
      );
    } finally {
      await app.stop();
    }
  });
}
