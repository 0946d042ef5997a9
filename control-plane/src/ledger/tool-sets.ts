// A model request's tool list, stored once. A run's first request carries the whole list, and
// most runs are short, so nearly every run stored the same schemas again (5.5 KB for the demo
// agent's built-in tools alone, compressed and moved out of line by TOAST each time). The list
// goes to model_tool_sets under the digest of its JSON, and the stored request names that digest
// ("toolSet") in its place; the read side puts the list back (requestWithToolsSql).
import { createHash } from "node:crypto";
import type { StoredModelRequest } from "../domain/model-request.js";
import { statement, type Sql } from "./sql.js";

/** Digests this process has seen stored: past this many it forgets them and checks again. */
const KNOWN_LIMIT = 10_000;

/** Tool lists remembered by their elements, newest first (a list per agent and connector, mostly). */
const RECENT_LISTS = 16;

const insertToolSet = statement<{ digest: string; tools: string }, never>("tool_set_insert")`
  INSERT INTO model_tool_sets (digest, tools) VALUES (${(p) => p.digest}, ${(p) => p.tools}::jsonb) ON CONFLICT (digest) DO NOTHING`;

/**
 * A stored request's column with its tool list back in place of the reference. A set that is
 * missing (never, as sets are not deleted) reads as no tools rather than failing the read.
 */
export const requestWithToolsSql = (alias: string): string =>
  `CASE WHEN ${alias}.request ? 'toolSet' THEN (${alias}.request - 'toolSet') || jsonb_build_object('tools',
    coalesce((SELECT t.tools FROM model_tool_sets t WHERE t.digest = ${alias}.request ->> 'toolSet'), '[]'::jsonb)) ELSE ${alias}.request END`;

/**
 * A stored request's size as the step pages count it (pg_column_size, as stored), its tool list
 * included: the readers put the list back (requestWithToolsSql), so a page bounded without it
 * would come back larger than it was counted.
 */
export const requestBytesSql = (alias: string): string =>
  `(pg_column_size(${alias}.request) + coalesce((SELECT pg_column_size(t.tools) FROM model_tool_sets t WHERE t.digest = ${alias}.request ->> 'toolSet'), 0))`;

export interface ToolSets {
  /**
   * The JSON to store for a request: its tool list replaced by the list's digest, the list stored
   * first (once per process and list). A request without tools is stored as it is.
   */
  requestJson(request: StoredModelRequest): Promise<string>;
}

export function createToolSets(sql: Sql): ToolSets {
  const known = new Set<string>();
  // A list two runs store at once is inserted once.
  const storing = new Map<string, Promise<void>>();
  const remember = (digest: string): void => {
    if (known.size >= KNOWN_LIMIT) known.clear();
    known.add(digest);
  };
  // When the insert returns the row is committed, by this insert or by a concurrent one it waited for.
  const store = (digest: string, tools: string): Promise<void> => {
    let pending = storing.get(digest);
    if (pending === undefined) {
      pending = sql
        .run(insertToolSet, { digest, tools })
        .then(() => remember(digest))
        .finally(() => storing.delete(digest));
      storing.set(digest, pending);
    }
    return pending;
  };
  // A run's first request lists its catalog's tool specs, the same objects run after run (the
  // registry's, frozen there): a list of the very objects of one seen before has its digest,
  // with nothing serialized or hashed again.
  const recent: { readonly tools: readonly unknown[]; readonly digest: string; readonly list: string }[] = [];
  const digestOf = (tools: readonly unknown[]): { digest: string; list: string } => {
    const seen = recent.find((entry) => entry.tools.length === tools.length && entry.tools.every((tool, i) => tool === tools[i]));
    if (seen !== undefined) return seen;
    const list = JSON.stringify(tools);
    const entry = { tools: [...tools], digest: createHash("sha256").update(list).digest("hex"), list };
    recent.unshift(entry);
    if (recent.length > RECENT_LISTS) recent.pop();
    return entry;
  };
  return {
    async requestJson(request) {
      // Most requests are deltas that name no tools: stored as they are, with no copy made.
      if (request.tools === undefined || request.tools.length === 0) return JSON.stringify(request);
      const { tools, ...rest } = request;
      const { digest, list } = digestOf(tools);
      // Committed before the request that names it: its WAL comes first, so a durable request's set is durable too.
      if (!known.has(digest)) await store(digest, list);
      return JSON.stringify({ ...rest, toolSet: digest });
    },
  };
}
