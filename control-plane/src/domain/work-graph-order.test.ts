import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { findCycle, longestPaths, pathTo, Reach, topologicalOrder, widestAntichain, type Successors } from "./work-graph-order.js";

/** A random DAG on n nodes: edges only from a lower to a higher position of a random permutation. */
const dag = fc.integer({ min: 1, max: 9 }).chain((n) =>
  fc.tuple(
    fc.constant(n),
    fc.shuffledSubarray(
      Array.from({ length: n }, (_, i) => i),
      { minLength: n, maxLength: n },
    ),
    fc.array(fc.tuple(fc.nat(n - 1), fc.nat(n - 1)), { maxLength: 3 * n }),
  ).map(([size, rank, pairs]): Successors => {
    const sets = Array.from({ length: size }, () => new Set<number>());
    for (const [a, b] of pairs) {
      const [from, to] = rank.indexOf(a) < rank.indexOf(b) ? [a, b] : [b, a];
      if (from !== to) sets[from]!.add(to);
    }
    return sets.map((set) => [...set].sort((x, y) => x - y));
  }),
);

/** Brute force: the largest set of nodes no path connects. */
function bruteWidth(successors: Successors, counted: readonly boolean[]): number {
  const n = successors.length;
  const reach = new Reach(successors, topologicalOrder(successors));
  let best = 0;
  for (let mask = 0; mask < 1 << n; mask++) {
    const members = Array.from({ length: n }, (_, i) => i).filter((i) => (mask & (1 << i)) !== 0);
    if (members.some((i) => !counted[i])) continue;
    const free = members.every((a) => members.every((b) => a === b || !reach.has(a, b)));
    if (free) best = Math.max(best, members.length);
  }
  return best;
}

describe("work graph order", () => {
  it("finds no cycle in a DAG, and a topological order that respects every edge", () => {
    fc.assert(
      fc.property(dag, (successors) => {
        expect(findCycle(successors)).toBeUndefined();
        const order = topologicalOrder(successors);
        expect([...order].sort((a, b) => a - b)).toEqual(successors.map((_, i) => i));
        successors.forEach((list, u) => list.forEach((v) => expect(order.indexOf(u)).toBeLessThan(order.indexOf(v))));
      }),
    );
  });

  it("reports a cycle whose consecutive nodes are joined by edges", () => {
    const successors: Successors = [[1], [2], [3], [1], []];
    const cycle = findCycle(successors);
    expect(cycle).toEqual([1, 2, 3]);
    expect(findCycle([[0]])).toEqual([0]);
  });

  it("breaks ties in the topological order by index", () => {
    expect(topologicalOrder([[3], [3], [], []])).toEqual([0, 1, 2, 3]);
    expect(topologicalOrder([[], [0], [0]])).toEqual([1, 2, 0]);
  });

  it("measures the longest path and returns it", () => {
    const successors: Successors = [[1, 2], [3], [3], [], [3]];
    const paths = longestPaths(successors, topologicalOrder(successors), () => 1);
    expect(paths.total[3]).toBe(3);
    expect(pathTo(paths, 3)).toEqual([0, 1, 3]);
  });

  it("computes the widest antichain exactly, matching brute force", () => {
    fc.assert(
      fc.property(dag, fc.array(fc.boolean(), { minLength: 9, maxLength: 9 }), (successors, flags) => {
        const counted = successors.map((_, i) => flags[i]!);
        const reach = new Reach(successors, topologicalOrder(successors));
        expect(widestAntichain(reach, counted)).toBe(bruteWidth(successors, counted));
      }),
      { numRuns: 300 },
    );
  });

  it("sees an antichain wider than any level", () => {
    // y -> x, y -> v -> z and a lone a: levels {a,y} {x,v} {z}, but a, x and z are unrelated.
    const [x, v, z] = [2, 3, 4];
    const successors: Successors = [[], [x, v], [], [z], []];
    const reach = new Reach(successors, topologicalOrder(successors));
    expect(widestAntichain(reach, [true, true, true, true, true])).toBe(3);
  });

  it("works past 32 nodes (several bit-set words)", () => {
    const n = 70;
    const chain: Successors = Array.from({ length: n }, (_, i) => (i + 1 < n ? [i + 1] : []));
    expect(widestAntichain(new Reach(chain, topologicalOrder(chain)), new Array<boolean>(n).fill(true))).toBe(1);
    const none: Successors = Array.from({ length: n }, () => []);
    expect(widestAntichain(new Reach(none, topologicalOrder(none)), new Array<boolean>(n).fill(true))).toBe(n);
  });
});
