// WorkGraph benchmark (issue #14). Part (a), built: admission of a 1,000-node proposal, p50 and
// p99 over many admissions, beside two baselines timed on the same proposal in the same run:
// reading it (JSON.parse + the zod schema the model's answer goes through) and a bare
// topological sort of the same DAG, the least any acyclicity check must do. Part (c), built: N
// branches of slow scripted calls as a graph against the same calls in one loop, end to end on an
// embedded PostgreSQL (graph-fanout.ts). Part (b): a chain of nodes (40 by default, at most 45
// within the root's default budget) whose calls answer at once, each node's ready -> claimed ->
// settled -> next ready, against one raw transaction writing the same rows; the p50 is over every
// node, the first few included, and a line of stage medians says where a node's time goes.
//
// The proposal: a human gate, then 9 layers of 111 nodes; each node after the first layer
// depends on two neighbours of the layer before, every 10th is a join and every 7th a verifier
// of one of its inputs. Write tools are gated, so every rule of admission runs on every node.
//
//   npm run bench -- graph [--nodes 1000] [--admissions 200] [--branches 8] [--call-ms 200] [--rounds 5]
//                          [--chain 40] [--raw-samples 20] [--skip-fanout] [--skip-chain] [--durability strict|relaxed]
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import type { RunBudget } from "../control-plane/src/domain/agent.js";
import { admitWorkGraph } from "../control-plane/src/domain/graph-admission.js";
import type { AdmissionContext, WorkGraphProposal } from "../control-plane/src/domain/work-graph.js";
import { topologicalOrder } from "../control-plane/src/domain/work-graph-order.js";
import { parseWorkGraphProposal } from "../control-plane/src/models/work-graph-proposal.js";
import { measureChain, measureFanout } from "./graph-fanout.js";
import { benchDurability, DURABILITY_OPTION, durabilityLabel, integerOption, ms, summarize, table, type Stats, verdict } from "./support.js";

const LAYERS = 9;
const TARGET_P50_MS = 50;
const TARGET_SPEEDUP = 5;
const TARGET_OVERHEAD_RATIO = 4;

/** The proposal as the model would write it (snake_case JSON). */
function proposalAnswer(nodeCount: number): { nodes: Record<string, unknown>[]; edges: { from: string; to: string }[] } {
  const width = Math.max(1, Math.floor((nodeCount - 1) / LAYERS));
  const nodes: Record<string, unknown>[] = [{ key: "approve", kind: "human_gate", objective: "Approve the changes" }];
  const edges: { from: string; to: string }[] = [];
  const budget = { wall_clock_ms: 30_000, iterations: 2, model_calls: 2, tool_calls: 4, input_tokens: 8_000, output_tokens: 800, output_bytes: 10_000, cost_micro_usd: 1_000 };
  const keyOf = (layer: number, i: number) => `l${layer}-n${i}`;
  for (let layer = 0; nodes.length < nodeCount; layer++) {
    for (let i = 0; i < width && nodes.length < nodeCount; i++) {
      const key = keyOf(layer, i);
      const inputs = layer === 0 ? ["approve"] : [keyOf(layer - 1, i), keyOf(layer - 1, (i + 1) % width)];
      const kind = layer === 0 ? "agent_loop" : i % 10 === 0 ? "join" : i % 7 === 0 ? "verify" : "agent_loop";
      nodes.push({
        key,
        kind,
        objective: `Work item ${i} of layer ${layer}`,
        tools: kind === "join" ? [] : i % 2 === 0 ? ["repo.read.v1"] : ["repo.read.v1", "repo.write.v1"],
        budget: kind === "join" ? {} : budget,
        needs_workspace: kind === "agent_loop",
        consumes: layer === 0 ? [] : ["diff"],
        produces: ["diff"],
        ...(kind === "verify" ? { subject: inputs[0] } : {}),
      });
      for (const from of inputs) edges.push({ from, to: key });
    }
  }
  return { nodes, edges };
}

function context(nodeCount: number): AdmissionContext {
  const plenty = (perNode: number) => perNode * nodeCount;
  const remaining: RunBudget = {
    maxWallClockMs: 3_600_000,
    maxIterations: plenty(2),
    maxModelCalls: plenty(2),
    maxToolCalls: plenty(4),
    maxInputTokens: plenty(8_000),
    maxOutputTokens: plenty(800),
    maxOutputBytes: plenty(10_000),
    maxCostMicroUsd: plenty(1_000),
  };
  return {
    ceilings: { maxNodes: nodeCount, maxDepth: 100, maxParallelism: nodeCount, maxRevisions: 3, maxReplans: 2 },
    policy: { kind: "allow_all", networkAccess: false },
    effectiveTools: [
      { fullName: "repo.read.v1", effect: "read" },
      { fullName: "repo.write.v1", effect: "write" },
    ],
    gatedEffects: ["write"],
    remaining,
    purpose: "initial",
    revisionsSoFar: 0,
    replansSoFar: 0,
  };
}

function time(times: number, warmup: number, work: () => void): Stats {
  for (let i = 0; i < warmup; i++) work();
  const samples: number[] = [];
  for (let i = 0; i < times; i++) {
    const start = performance.now();
    work();
    samples.push(performance.now() - start);
  }
  return summarize(samples);
}

export default async function run(args: readonly string[]): Promise<void> {
  const { values } = parseArgs({
    args: [...args],
    options: {
      nodes: { type: "string", default: "1000" },
      admissions: { type: "string", default: "200" },
      branches: { type: "string", default: "8" },
      "call-ms": { type: "string", default: "200" },
      rounds: { type: "string", default: "5" },
      "skip-fanout": { type: "boolean", default: false },
      chain: { type: "string", default: "40" },
      "raw-samples": { type: "string", default: "20" },
      "skip-chain": { type: "boolean", default: false },
      ...DURABILITY_OPTION,
    },
  });
  const durability = benchDurability(values.durability);
  const nodeCount = integerOption("nodes", values.nodes, 2);
  const admissions = integerOption("admissions", values.admissions, 1);
  const branches = integerOption("branches", values.branches, 2);
  const callMs = integerOption("call-ms", values["call-ms"], 1);
  const rounds = integerOption("rounds", values.rounds, 1);
  const chainLength = integerOption("chain", values.chain, 2);
  const rawSamples = integerOption("raw-samples", values["raw-samples"], 1);
  const text = JSON.stringify(proposalAnswer(nodeCount));
  const parsed = parseWorkGraphProposal(JSON.parse(text));
  if (!parsed.ok) throw new Error(`the bench proposal does not parse: ${parsed.problems.join("; ")}`);
  const proposal: WorkGraphProposal = parsed.proposal;
  const ctx = context(nodeCount);
  const admission = admitWorkGraph(proposal, ctx);
  if (!admission.admitted) throw new Error(`the bench proposal is not admitted: ${JSON.stringify(admission.reasons.slice(0, 3))}`);
  const index = new Map(proposal.nodes.map((node, i) => [node.key, i]));
  const warmup = Math.min(20, admissions);

  const admit = time(admissions, warmup, () => {
    if (!admitWorkGraph(proposal, ctx).admitted) throw new Error("admission changed its mind");
  });
  const read = time(admissions, warmup, () => {
    if (!parseWorkGraphProposal(JSON.parse(text)).ok) throw new Error("parse changed its mind");
  });
  const sort = time(admissions, warmup, () => {
    const successors = proposal.nodes.map((): number[] => []);
    for (const edge of proposal.edges) successors[index.get(edge.from)!]!.push(index.get(edge.to)!);
    if (topologicalOrder(successors).length !== proposal.nodes.length) throw new Error("sort lost nodes");
  });

  const fanout = values["skip-fanout"] ? undefined : await measureFanout(branches, callMs, rounds, durability, (line) => process.stderr.write(`${line}\n`));
  const median = (xs: readonly number[]): number => summarize(xs).p50;
  const chain = values["skip-chain"] ? undefined : await measureChain(chainLength, rawSamples, durability, (line) => process.stderr.write(`${line}\n`));
  const overhead = chain === undefined ? undefined : median(chain.perNodeMs) / median(chain.rawMs);
  const chainLines =
    chain === undefined || overhead === undefined
      ? ["(b) per-node scheduling overhead: skipped (--skip-chain)"]
      : [
          ...table(
            [`(b) a chain of ${chainLength} nodes`, "p50 ms", "min ms", "max ms"],
            [
              ["per node: ready -> claimed -> settled -> next ready", ms(median(chain.perNodeMs)), ms(Math.min(...chain.perNodeMs)), ms(Math.max(...chain.perNodeMs))],
              ["baseline: one raw transaction of the same rows", ms(median(chain.rawMs)), ms(Math.min(...chain.rawMs)), ms(Math.max(...chain.rawMs))],
            ],
          ),
          `(b) per-node overhead ${overhead.toFixed(2)}x a raw transaction, target <= ${TARGET_OVERHEAD_RATIO}x: ${verdict(overhead <= TARGET_OVERHEAD_RATIO)}`,
        ];
  const speedup = fanout === undefined ? undefined : median(fanout.loopMs) / median(fanout.graphMs);
  const fanoutLines =
    fanout === undefined || speedup === undefined
      ? ["(c) fan-out: skipped (--skip-fanout)"]
      : [
          ...table(
            [`(c) ${branches} branches x ${callMs} ms calls`, "median ms", "min ms", "max ms"],
            [
              ["as a graph (child runs + join + root turn)", ms(median(fanout.graphMs)), ms(Math.min(...fanout.graphMs)), ms(Math.max(...fanout.graphMs))],
              ["baseline: the same calls in one loop", ms(median(fanout.loopMs)), ms(Math.min(...fanout.loopMs)), ms(Math.max(...fanout.loopMs))],
            ],
          ),
          `(c) speedup ${speedup.toFixed(2)}x over ${rounds} round(s), target >= ${TARGET_SPEEDUP}x: ${verdict(speedup >= TARGET_SPEEDUP)}`,
        ];
  const { graph } = admission;
  const lines = [
    `WorkGraph bench: ${proposal.nodes.length} nodes, ${proposal.edges.length} edges, depth ${graph.depth}, width ${graph.width}, ${admissions} admissions each; ${durabilityLabel(durability)}`,
    "",
    ...table(
      ["(a) figure", "p50 ms", "p99 ms", "p50 / admission"],
      [
        ["admission (all rules)", ms(admit.p50), ms(admit.p99), "1.00"],
        ["baseline: JSON.parse + zod parse", ms(read.p50), ms(read.p99), (read.p50 / admit.p50).toFixed(2)],
        ["baseline: topological sort only", ms(sort.p50), ms(sort.p99), (sort.p50 / admit.p50).toFixed(2)],
      ],
    ),
    "",
    `(a) admission p50 ${ms(admit.p50)} ms, target <= ${TARGET_P50_MS} ms: ${verdict(admit.p50 <= TARGET_P50_MS)}`,
    ...chainLines,
    ...fanoutLines,
    "",
    `RESULT mode=${durability} admit_1000_p50_ms=${ms(admit.p50)} admit_1000_p99_ms=${ms(admit.p99)} parse_1000_p50_ms=${ms(read.p50)} ` +
      `toposort_1000_p50_ms=${ms(sort.p50)} node_overhead_ratio=${overhead === undefined ? "skipped" : overhead.toFixed(2)} fanout_speedup=${speedup === undefined ? "skipped" : speedup.toFixed(2)}`,
  ];
  process.stdout.write(`${lines.join("\n")}\n`);
  return Promise.resolve();
}
