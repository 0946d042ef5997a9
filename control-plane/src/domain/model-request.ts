// How a model call's request is kept in the ledger. Each call of a run sends the whole
// transcript, which grows by a turn and a result every iteration: stored whole, a run of n
// iterations would write O(n²) bytes. So a call's request is stored as a delta on the run's
// previous call: how many of its messages are kept, the messages after them, and the tool
// catalog only when it changed. Compaction rewrites old results, so "kept" is the common
// prefix, not a fixed count. The first call a worker makes after claiming a run is stored
// whole, so a chain never depends on a call another worker remembered. The ledger keeps each
// distinct catalog once and stores a reference in its place (ledger/tool-sets.ts); what it hands
// back here has the catalog in place again.

/** What a model call was asked: the messages and the tool catalog, as sent. */
export interface ModelRequestRecord {
  readonly messages: readonly unknown[];
  readonly tools: readonly unknown[];
}

/** A stored request: whole, or a delta on the call `base` of the same run. */
export type StoredModelRequest =
  | ModelRequestRecord
  | {
      readonly base: string;
      /** Messages taken from the base request, from its start. */
      readonly keep: number;
      /** The messages after them. */
      readonly messages: readonly unknown[];
      /** Present only when the catalog differs from the base's. */
      readonly tools?: readonly unknown[];
    };

/** The previous call of a run, as the runner remembers it to store the next one as a delta. */
export interface PreviousModelRequest {
  readonly callId: string;
  readonly request: ModelRequestRecord;
}

export interface RequestForStorage {
  readonly stored: StoredModelRequest;
  /** Remember this for the next call. */
  readonly remembered: PreviousModelRequest;
}

export function requestForStorage(
  callId: string,
  request: ModelRequestRecord,
  previous: PreviousModelRequest | undefined,
): RequestForStorage {
  const remembered = { callId, request };
  if (previous === undefined) return { stored: request, remembered };
  const before = previous.request.messages;
  let keep = 0;
  while (keep < request.messages.length && keep < before.length && sameJson(request.messages[keep], before[keep])) keep++;
  const delta = {
    base: previous.callId,
    keep,
    messages: request.messages.slice(keep),
    ...(sameJson(request.tools, previous.request.tools) ? {} : { tools: request.tools }),
  };
  return { stored: delta, remembered };
}

/** Whether two JSON-shaped values serialize alike (undefined properties count as absent, as in JSON). */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameJson(a[i], b[i])) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  // Loops, not Object.entries: this runs over every message of every model call.
  const left = a as Record<string, unknown>;
  const right = b as Record<string, unknown>;
  let keys = 0;
  for (const key in left) {
    const value = left[key];
    if (value === undefined) continue;
    keys++;
    if (!sameJson(value, right[key])) return false;
  }
  for (const key in right) if (right[key] !== undefined) keys--;
  return keys === 0;
}

function isDelta(stored: StoredModelRequest): stored is Extract<StoredModelRequest, { base: string }> {
  return typeof (stored as { base?: unknown }).base === "string";
}

/**
 * Whole requests from stored ones. `calls` must hold every call the wanted ones build on
 * (all calls of their runs, in any order). A delta whose base is missing comes back with
 * the messages it has and `incomplete: true`, never invented ones.
 */
export function expandModelRequests(
  calls: readonly { readonly id: string; readonly request: StoredModelRequest }[],
): Map<string, ModelRequestRecord & { readonly incomplete?: true }> {
  const byId = new Map(calls.map((call) => [call.id, call.request] as const));
  const expanded = new Map<string, ModelRequestRecord & { readonly incomplete?: true }>();
  const expand = (id: string): (ModelRequestRecord & { readonly incomplete?: true }) | undefined => {
    const done = expanded.get(id);
    if (done !== undefined) return done;
    // Walk back to a whole request (iteratively: a long run has a long chain), then forward.
    const chain: string[] = [];
    let cursor: string | undefined = id;
    while (cursor !== undefined && !expanded.has(cursor)) {
      const stored = byId.get(cursor);
      if (stored === undefined || chain.includes(cursor)) break;
      chain.push(cursor);
      cursor = isDelta(stored) ? stored.base : undefined;
    }
    let base = cursor === undefined ? undefined : expanded.get(cursor);
    for (const link of chain.reverse()) {
      const stored = byId.get(link)!;
      let whole: ModelRequestRecord & { readonly incomplete?: true };
      if (!isDelta(stored)) whole = stored;
      else if (base === undefined) whole = { messages: stored.messages, tools: stored.tools ?? [], incomplete: true };
      else {
        whole = {
          messages: [...base.messages.slice(0, stored.keep), ...stored.messages],
          tools: stored.tools ?? base.tools,
          ...(base.incomplete === true ? { incomplete: true as const } : {}),
        };
      }
      expanded.set(link, whole);
      base = whole;
    }
    return expanded.get(id);
  };
  for (const call of calls) expand(call.id);
  return expanded;
}
