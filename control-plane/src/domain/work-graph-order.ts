// The order theory admission needs, on nodes numbered 0..n-1 in proposal order: one cycle,
// a stable topological order, longest paths, reachability and the widest antichain. Every loop
// visits nodes and successors in index order, so the same input always gives the same answer.

/** Successor lists, each ascending and without repeats. */
export type Successors = readonly (readonly number[])[];

/** The first cycle a depth-first search in index order meets, as node indices along the cycle; undefined when acyclic. */
export function findCycle(successors: Successors): readonly number[] | undefined {
  const n = successors.length;
  const state = new Uint8Array(n); // 0 unseen, 1 on the stack, 2 done
  const stack: number[] = [];
  const cursor: number[] = [];
  for (let start = 0; start < n; start++) {
    if (state[start] !== 0) continue;
    stack.push(start);
    cursor.push(0);
    state[start] = 1;
    while (stack.length > 0) {
      const top = stack.length - 1;
      const node = stack[top]!;
      const next = successors[node]![cursor[top]!];
      if (next === undefined) {
        state[node] = 2;
        stack.pop();
        cursor.pop();
        continue;
      }
      cursor[top] = cursor[top]! + 1;
      if (state[next] === 1) return stack.slice(stack.indexOf(next));
      if (state[next] === 0) {
        state[next] = 1;
        stack.push(next);
        cursor.push(0);
      }
    }
  }
  return undefined;
}

/** Kahn's algorithm, always taking the lowest-indexed ready node. The graph must be acyclic. */
export function topologicalOrder(successors: Successors): readonly number[] {
  const n = successors.length;
  const indegree = new Int32Array(n);
  for (const list of successors) for (const next of list) indegree[next] = indegree[next]! + 1;
  const heap = new MinHeap();
  for (let i = 0; i < n; i++) if (indegree[i] === 0) heap.push(i);
  const order: number[] = [];
  for (let node = heap.pop(); node !== undefined; node = heap.pop()) {
    order.push(node);
    for (const next of successors[node]!) {
      indegree[next] = indegree[next]! - 1;
      if (indegree[next] === 0) heap.push(next);
    }
  }
  return order;
}

export interface LongestPaths {
  /** Per node: the most weight on a path ending at it (the node's own weight included). */
  readonly total: Float64Array;
  /** Per node: the predecessor on that path, or -1 for its start. */
  readonly via: Int32Array;
}

/** Longest weighted paths over a topological order (every weight >= 0). */
export function longestPaths(successors: Successors, order: readonly number[], weight: (node: number) => number): LongestPaths {
  const n = successors.length;
  const total = new Float64Array(n);
  const via = new Int32Array(n).fill(-1);
  for (const node of order) total[node] = weight(node);
  for (const node of order) {
    for (const next of successors[node]!) {
      const through = total[node]! + weight(next);
      if (through > total[next]!) {
        total[next] = through;
        via[next] = node;
      }
    }
  }
  return { total, via };
}

/** The node indices of the path ending at `end`, from its start. */
export function pathTo(paths: LongestPaths, end: number): readonly number[] {
  const path: number[] = [];
  for (let node = end; node >= 0; node = paths.via[node]!) path.push(node);
  return path.reverse();
}

/** Reachability as bit sets: bit v of row u is set when a path of one or more edges leads from u to v. */
export class Reach {
  readonly words: number;
  private readonly bits: Uint32Array;

  constructor(successors: Successors, order: readonly number[]) {
    const n = successors.length;
    this.words = Math.ceil(n / 32);
    this.bits = new Uint32Array(n * this.words);
    // Reverse topological order: every successor's row is complete before it is merged in.
    for (let k = order.length - 1; k >= 0; k--) {
      const node = order[k]!;
      const row = node * this.words;
      for (const next of successors[node]!) {
        this.bits[row + (next >>> 5)]! |= 1 << (next & 31);
        const from = next * this.words;
        for (let w = 0; w < this.words; w++) this.bits[row + w]! |= this.bits[from + w]!;
      }
    }
  }

  has(from: number, to: number): boolean {
    return (this.bits[from * this.words + (to >>> 5)]! & (1 << (to & 31))) !== 0;
  }

  word(from: number, w: number): number {
    return this.bits[from * this.words + w]!;
  }
}

/**
 * The size of the widest antichain among the `counted` nodes (nodes no path connects), which is
 * the most of them that can ever run at once. By Dilworth's theorem it is the number of counted
 * nodes less a maximum matching of "u reaches v" pairs (Kuhn's augmenting paths on bit sets).
 */
export function widestAntichain(reach: Reach, counted: readonly boolean[]): number {
  const n = counted.length;
  const words = reach.words;
  const mask = new Uint32Array(words);
  for (let v = 0; v < n; v++) if (counted[v]) mask[v >>> 5]! |= 1 << (v & 31);
  const matchOf = new Int32Array(n).fill(-1); // right side v -> left side u
  const visited = new Uint32Array(words);

  const augment = (u: number): boolean => {
    for (let w = 0; w < words; w++) {
      let free = reach.word(u, w) & mask[w]! & ~visited[w]!;
      while (free !== 0) {
        const bit = free & -free;
        free ^= bit;
        visited[w]! |= bit;
        const v = (w << 5) | (31 - Math.clz32(bit));
        const holder = matchOf[v]!;
        if (holder < 0 || augment(holder)) {
          matchOf[v] = u;
          return true;
        }
      }
    }
    return false;
  };

  let countedNodes = 0;
  let matched = 0;
  for (let u = 0; u < n; u++) {
    if (!counted[u]) continue;
    countedNodes++;
    visited.fill(0);
    if (augment(u)) matched++;
  }
  return countedNodes - matched;
}

/** A binary min-heap of node indices. */
class MinHeap {
  private readonly items: number[] = [];

  push(value: number): void {
    const items = this.items;
    items.push(value);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (items[parent]! <= value) break;
      items[i] = items[parent]!;
      i = parent;
    }
    items[i] = value;
  }

  pop(): number | undefined {
    const items = this.items;
    const top = items[0];
    const last = items.pop();
    if (top === undefined || last === undefined || items.length === 0) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= items.length) break;
      const right = left + 1;
      const child = right < items.length && items[right]! < items[left]! ? right : left;
      if (items[child]! >= last) break;
      items[i] = items[child]!;
      i = child;
    }
    items[i] = last;
    return top;
  }
}
