// Every benchmark runs end to end on a few iterations, so none rots between the sittings that time
// them: it exits 0, states the durability mode it ran in, and prints its targets line (each target
// judged met or MISSED) and its RESULT line with every figure a number. What the figures are is
// not asserted: performance is measured by the benches themselves, not by tests.
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT, runScript, STDERR_MARK } from "./support/child-processes.js";
import { skipsWithoutBrowser } from "./support/browser.js";
import { whyDockerIsUnavailable } from "./support/sandbox-support.js";

const BENCH = path.join(ROOT, "bench", "run.ts");
const BENCH_TIMEOUT_MS = 150_000;

interface BenchOutput {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** `npm run bench -- <args>` as a child process, with the mode left to the bench's own default. */
async function bench(args: readonly string[]): Promise<BenchOutput> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env["KEEL_DURABILITY"];
  const { code, lines } = await runScript(BENCH, args, { timeoutMs: BENCH_TIMEOUT_MS - 5_000, env });
  const stderr = lines.filter((line) => line.startsWith(STDERR_MARK)).map((line) => line.slice(STDERR_MARK.length));
  return { code, stdout: lines.filter((line) => !line.startsWith(STDERR_MARK)).join("\n"), stderr: stderr.join("\n") };
}

/** The RESULT lines' key=value pairs, in order. */
function results(stdout: string): Array<Array<[string, string]>> {
  return stdout
    .split("\n")
    .filter((line) => line.startsWith("RESULT "))
    .map((line) => line.slice("RESULT ".length).split(" ").map((pair) => pair.split("=", 2) as [string, string]));
}

/** Asserts a clean exit, one RESULT line per mode with these keys (after `mode`) all numeric, and a judged targets line. */
function expectReport(output: BenchOutput, modes: readonly string[], keys: readonly string[], targets: RegExp | undefined): void {
  expect(output.code, `the bench failed:\n${output.stderr.slice(-2000)}`).toBe(0);
  const lines = results(output.stdout);
  expect(lines.map((pairs) => pairs.find(([key]) => key === "mode")?.[1])).toEqual(modes);
  for (const pairs of lines) {
    expect(pairs.map(([key]) => key).filter((key) => key !== "mode")).toEqual(keys);
    for (const [key, value] of pairs) if (key !== "mode") expect(Number.isFinite(Number(value)), `${key}=${value}`).toBe(true);
  }
  if (targets === undefined) return;
  const judged = output.stdout.split("\n").filter((line) => targets.test(line));
  expect(judged, `no targets line in:\n${output.stdout}`).toHaveLength(modes.length);
  for (const line of judged) expect(line).toMatch(/\b(met|MISSED)\b/);
}

describe("benchmarks, on a few iterations each", () => {
  it(
    "peers runs Keel, Restate, DBOS and the raw transaction in both modes and prints the issue's RESULT line for each",
    async () => {
      const output = await bench(["peers", "--iterations", "5", "--concurrent", "2", "--warmup", "0", "--rounds", "1"]);
      expectReport(
        output,
        ["strict", "relaxed"],
        ["keel_p50_ms", "restate_p50_ms", "dbos_p50_ms", "keel_per_s", "restate_per_s", "dbos_per_s", "vs_restate_p50", "vs_restate_tput", "vs_dbos_p50", "vs_dbos_tput"],
        /^targets \(keel against each peer\)/,
      );
      // No peer was skipped: each is in both tables with its setup, flushes on in strict and off in relaxed.
      expect(output.stdout).not.toContain("skipped");
      expect(output.stdout).toMatch(/restate .*log fsync on/);
      expect(output.stdout).toMatch(/restate .*log fsync off/);
      expect(output.stdout).toMatch(/dbos .*synchronous_commit=on/);
      expect(output.stdout).toMatch(/dbos .*synchronous_commit=off/);
    },
    BENCH_TIMEOUT_MS,
  );

  it(
    "loop, in relaxed mode, against an asynchronous raw transaction (phase sizes equal to the warm-up's)",
    async () => {
      const output = await bench(["loop", "--iterations", "5", "--concurrent", "2", "--raw", "20", "--durability", "relaxed"]);
      expectReport(output, ["relaxed"], ["overhead_p50_ms", "raw_txn_p50_ms", "overhead_ratio", "steps_per_s", "raw_txn_per_s", "throughput_ratio"], /^targets:/);
      expect(output.stdout).toContain("Keel durability=relaxed, raw baseline with synchronous_commit=off");
    },
    BENCH_TIMEOUT_MS,
  );

  it(
    "first-slice, through gRPC, against the raw transaction of the same rows",
    async () => {
      const output = await bench(["first-slice", "--messages", "20", "--warmup", "20", "--concurrency", "4", "--raw", "20", "--sittings", "1"]);
      expectReport(output, ["strict"], ["p50_ms", "p99_ms", "raw_txn_p50_ms", "messages_per_s", "raw_txn_per_s", "throughput_ratio"], /^targets:/);
    },
    BENCH_TIMEOUT_MS,
  );

  it(
    "ingress, message to first model call",
    async () => {
      const output = await bench(["ingress", "--messages", "8", "--concurrent", "2", "--think-ms", "10", "--warmup", "2", "--raw", "20"]);
      expectReport(output, ["strict"], ["p50_ms", "p99_ms", "raw_txn_p50_ms", "p50_ratio", "p99_ratio"], /^targets:/);
    },
    BENCH_TIMEOUT_MS,
  );

  it(
    "graph, subscribe and progress",
    async () => {
      const graph = await bench(["graph", "--nodes", "20", "--admissions", "5", "--branches", "2", "--call-ms", "20", "--rounds", "1", "--chain", "3", "--raw-samples", "3"]);
      expectReport(graph, ["strict"], ["admit_1000_p50_ms", "admit_1000_p99_ms", "parse_1000_p50_ms", "toposort_1000_p50_ms", "node_overhead_ratio", "fanout_speedup"], undefined);
      expect(graph.stdout.match(/target .*: (met|MISSED)$/gm)).toHaveLength(3);

      const subscribe = await bench(["subscribe", "--streams", "10", "--connectors", "2", "--emissions", "10", "--rate", "100"]);
      expect(subscribe.code, subscribe.stderr.slice(-2000)).toBe(0);
      expect(subscribe.stdout).toMatch(/^target: .*paced [\d.]+x (met|MISSED); back to back [\d.]+x (met|MISSED)$/m);
      expect(subscribe.stdout).toMatch(/^RESULT streams=10 /m);

      const progress = await bench(["progress", "--runs", "10", "--probes", "5"]);
      expect(progress.code, progress.stderr.slice(-2000)).toBe(0);
      expect(progress.stdout).toMatch(/^targets: emission_ratio >= 0.5 \((met|MISSED)\), supervisor CPU .*\((met|MISSED)\), ingress p99 .*\((met|MISSED)\)$/m);
      expect(progress.stdout).toMatch(/^RESULT emissions_per_s=\d+ /m);
    },
    BENCH_TIMEOUT_MS,
  );

  it("refuses an option it cannot use with one line naming it, and exit code 2", async () => {
    for (const [args, message] of [
      [["loop", "--iterations", "1"], 'bench: --iterations must be an integer from 2 up, not "1"'],
      [["peers", "--peers", "keel,temporal"], 'bench: --peers: unknown peer "temporal" (known: keel, restate, dbos, raw)'],
      [["first-slice", "--durability", "eventual"], 'bench: --durability must be strict or relaxed, not "eventual"'],
      [["ingress", "--nope"], "bench: Unknown option '--nope'"],
    ] as const) {
      const output = await bench(args);
      expect(output.code).toBe(2);
      expect(output.stderr.trim()).toBe(message);
    }
  });

  const docker = whyDockerIsUnavailable();
  const requireDocker = process.env["KEEL_REQUIRE_DOCKER"] === "1";
  if (docker !== undefined && !requireDocker) console.warn(`sandbox bench smoke test skipped: ${docker}`);
  it.skipIf(docker !== undefined && !requireDocker)(
    "sandbox, on the Docker engine, against raw dockerode",
    async () => {
      if (docker !== undefined) throw new Error(docker);
      const output = await bench(["sandbox", "--acquisitions", "2", "--cold", "2", "--pool-size", "1", "--execs", "3", "--warmup", "1", "--stream-mib", "1"]);
      expectReport(output, ["strict"], ["warm_p50_ms", "cold_p50_ms", "exec_ratio", "stream_mb_s", "stream_ratio", "peak_rss_mb"], /^targets:/);
    },
    BENCH_TIMEOUT_MS,
  );

  it.skipIf(skipsWithoutBrowser("the dashboard bench smoke test"))(
    "dashboard, in chromium, against the Connect client",
    async () => {
      const output = await bench(["dashboard", "--steps", "20", "--opens", "1"]);
      expectReport(
        output,
        ["strict"],
        ["run_20_steps_open_ms", "dropped_frames", "scroll_frames", "idle_frame_ms", "idle_dropped_frames", "open_p99_ms", "all_rows_ms", "baseline_first_page_ms", "baseline_all_steps_ms"],
        undefined,
      );
    },
    BENCH_TIMEOUT_MS,
  );
});
