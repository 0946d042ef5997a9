// The bench entry: `npm run bench -- <name> [args...]`. Each benchmark is a module with a
// default-exported `run(args)`; it prints its own table and a final `RESULT ...` line.

import { BenchUsageError } from "./support.js";

export type Benchmark = (args: readonly string[]) => Promise<void>;

const BENCHMARKS: Readonly<Record<string, { readonly describe: string; readonly load: () => Promise<{ default: Benchmark }> }>> = {
  "first-slice": {
    describe: "message→reply latency through a real Keel on embedded PostgreSQL, against a raw SQL transaction of the same rows",
    load: () => import("./first-slice.js"),
  },
  ingress: {
    describe: "message→first model call latency, coalesce window 0, 1 and 50 concurrent conversations, against a raw SQL transaction of the same rows",
    load: () => import("./ingress.js"),
  },
  loop: {
    describe: "harness overhead per loop iteration and steps/s, 1 and 16 concurrent runs, against a raw SQL transaction of the same rows",
    load: () => import("./loop.js"),
  },
  peers: {
    describe: "the loop workload through Keel, Restate and DBOS Transact beside a raw 2-row transaction, in strict and relaxed durability",
    load: () => import("./peers.js"),
  },
  abuse: {
    describe: "an authorized SubmitMessage's p50/p99 idle and under unauthenticated 4 MiB uploads and random-token calls, with server RSS",
    load: () => import("./abuse.js"),
  },
  subscribe: {
    describe: "emission commit latency with 1 and with 2,000 open Subscribe streams (every stream must receive every emission of its connector)",
    load: () => import("./subscribe.js"),
  },
  graph: {
    describe: "WorkGraph: admission of a 1,000-node proposal, per-node scheduling on a chain, 8 branches as a graph against one loop, each beside its baseline",
    load: () => import("./graph.js"),
  },
  progress: { describe: "1,000 supervised runs on a manual clock, notices through Subscribe with acks, against raw insert+NOTIFY+update", load: () => import("./progress.js") },
  dashboard: { describe: "opening a 1,000-step run in the dashboard (chromium) and scrolling it, against fetching the same data with the Connect client", load: () => import("./dashboard.js") },
  sandbox: {
    describe: "warm-pool acquisition, exec round trip and observation streaming on a real Docker engine and sandbox agent, against raw dockerode",
    load: () => import("./sandbox.js"),
  },
};

function listBenchmarks(): string {
  return Object.entries(BENCHMARKS)
    .map(([name, { describe }]) => `  ${name.padEnd(14)} ${describe}`)
    .join("\n");
}

async function main(argv: readonly string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === undefined || name === "--help" || name === "help") {
    process.stderr.write(`usage: npm run bench -- <name> [args...]\n\navailable benchmarks:\n${listBenchmarks()}\n`);
    return name === undefined ? 2 : 0;
  }
  const benchmark = Object.hasOwn(BENCHMARKS, name) ? BENCHMARKS[name] : undefined;
  if (benchmark === undefined) {
    process.stderr.write(`bench: unknown benchmark ${JSON.stringify(name)}\n\navailable benchmarks:\n${listBenchmarks()}\n`);
    return 2;
  }
  const { default: run } = await benchmark.load();
  await run(args);
  return 0;
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (error) {
  // An option the bench cannot use is the caller's to fix: its message says how, a stack would not.
  const code = (error as { code?: unknown } | undefined)?.code;
  if (error instanceof BenchUsageError || (typeof code === "string" && code.startsWith("ERR_PARSE_ARGS"))) {
    process.stderr.write(`bench: ${(error as Error).message}\n`);
    process.exitCode = 2;
  } else {
    process.stderr.write(`bench: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exitCode = 1;
  }
}
// Everything is stopped by now. If a stray handle still holds the event loop, say so and
// leave anyway instead of hanging a CI job; an unref'd timer never fires on a clean exit.
setTimeout(() => {
  process.stderr.write("bench: something still held the event loop 5 s after the benchmark finished; exiting\n");
  process.exit();
}, 5000).unref();
