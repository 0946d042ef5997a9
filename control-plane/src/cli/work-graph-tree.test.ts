import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { RunUsageSchema, type RunUsage } from "../../../gen/keel/v1/run_pb.js";
import { WorkGraphSchema, WorkNodeKind, WorkNodeStatus, type WorkGraph } from "../../../gen/keel/v1/work_graph_pb.js";
import { renderWorkGraphTree, workGraphSummary } from "./work-graph-tree.js";

const ROOT = "0000aaaa-0000-4000-8000-000000000000";
const run = (n: number) => `${String(n).repeat(8)}-1111-4000-8000-000000000000`;
const S = WorkNodeStatus;

function graph(nodes: { key: string; kind?: WorkNodeKind; status: WorkNodeStatus; dependsOn?: string[]; runs?: string[] }[]): WorkGraph {
  return create(WorkGraphSchema, {
    id: "99990000-0000-4000-8000-000000000000",
    rootRunId: ROOT,
    revision: 1,
    nodes: nodes.map((n) => ({
      key: n.key,
      kind: n.kind ?? WorkNodeKind.AGENT_LOOP,
      status: n.status,
      dependsOn: n.dependsOn ?? [],
      attempts: (n.runs ?? []).map((childRunId, i) => ({ ordinal: i + 1, status: n.status, childRunId })),
    })),
  });
}

const spent = (modelCalls: number, tokens: number, cost: number): RunUsage =>
  create(RunUsageSchema, { modelCalls, inputTokens: BigInt(tokens), outputTokens: 0n, costMicroUsd: BigInt(cost) });

describe("the WorkGraph tree in keel inspect", () => {
  it("draws a fan-out/fan-in graph with the join once, under its first input, naming the others", () => {
    const fan = graph([
      { key: "a", status: S.SUCCEEDED, runs: [run(1)] },
      { key: "b", status: S.RUNNING, runs: [run(2), run(3)] },
      { key: "c", status: S.SUCCEEDED, runs: [run(4)] },
      { key: "merge", kind: WorkNodeKind.JOIN, status: S.PENDING, dependsOn: ["a", "b", "c"] },
      { key: "check", kind: WorkNodeKind.VERIFY, status: S.SUCCEEDED, runs: [run(5)] },
    ]);
    const usage = new Map([
      [run(1), spent(1, 110, 7)],
      [run(2), spent(2, 200, 3)],
      [run(3), spent(1, 50, 1)],
    ]);
    expect(renderWorkGraphTree(fan, usage, run(3))).toEqual([
      "work graph 99990000  revision 1, 0 replans",
      "root run 0000aaaa",
      "├─ a  agent_loop  succeeded  run 11111111  1 attempt  1 model call, 110 tokens, 7 µUSD",
      "│  └─ merge  join  pending  no run  0 attempts  0 model calls, 0 tokens, 0 µUSD  also after: b, c",
      "├─ b  agent_loop  running  run 33333333  2 attempts  3 model calls, 250 tokens, 4 µUSD  ← this run",
      "├─ c  agent_loop  succeeded  run 44444444  1 attempt  0 model calls, 0 tokens, 0 µUSD",
      "└─ check  verify  succeeded  run 55555555  1 attempt  0 model calls, 0 tokens, 0 µUSD",
      "3 of 5 nodes done, 1 running, 1 pending",
    ]);
  });

  it("draws a chain as a staircase and marks the root when it is the run inspected", () => {
    const chain = graph([
      { key: "plan", status: S.SUCCEEDED, runs: [run(1)] },
      { key: "build", status: S.FAILED, dependsOn: ["plan"], runs: [run(2)] },
      { key: "ship", status: S.CANCELLED, dependsOn: ["build"] },
    ]);
    const lines = renderWorkGraphTree(chain, new Map(), ROOT);
    expect(lines.slice(1, 5)).toEqual([
      "root run 0000aaaa  ← this run",
      "└─ plan  agent_loop  succeeded  run 11111111  1 attempt  0 model calls, 0 tokens, 0 µUSD",
      "   └─ build  agent_loop  failed  run 22222222  1 attempt  0 model calls, 0 tokens, 0 µUSD",
      "      └─ ship  agent_loop  cancelled  no run  0 attempts  0 model calls, 0 tokens, 0 µUSD",
    ]);
    expect(lines.at(-1)).toBe("1 of 3 nodes done, 1 failed, 1 cancelled");
  });

  it("still lists a node whose inputs form a cycle, rather than dropping it", () => {
    const odd = graph([
      { key: "x", status: S.PENDING, dependsOn: ["y"] },
      { key: "y", status: S.PENDING, dependsOn: ["x"] },
    ]);
    const lines = renderWorkGraphTree(odd, new Map(), ROOT);
    expect(lines.filter((l) => l.includes("not reachable"))).toHaveLength(2);
    expect(workGraphSummary(odd)).toBe("0 of 2 nodes done, 2 pending");
  });
});
