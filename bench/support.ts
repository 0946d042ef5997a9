// Shared by the benchmarks: percentiles, the printed table, ports and settings.
import { createServer } from "node:net";

export interface Stats {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
}

/** Nearest-rank percentiles. */
export function summarize(samples: readonly number[]): Stats {
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = (p: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN;
  return { n: sorted.length, p50: rank(50), p99: rank(99) };
}

export const ms = (value: number): string => value.toFixed(2);

/** First column left-aligned, the rest right-aligned, with a rule under the header. */
export function table(header: readonly string[], body: readonly (readonly string[])[]): string[] {
  const all = [header, ...body];
  const widths = header.map((_, c) => Math.max(...all.map((row) => (row[c] ?? "").length)));
  const format = (row: readonly string[]) =>
    row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0))).join("  ");
  return [format(header), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(format)];
}

export function pick(env: NodeJS.ProcessEnv, keys: readonly string[]): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const key of keys) {
    const value = env[key];
    if (value !== undefined && value !== "") picked[key] = value;
  }
  return picked;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}
