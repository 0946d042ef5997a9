// Output and results a host sent for commands nobody here waits for (a host that reconnected
// flushed them, or the waiting worker moved on), kept for a while so a re-attach collects them.
// Bounded in bytes per command and in total, output and results alike: past a bound the oldest
// go, with a warning, and a later re-attach learns that the command's output was cut.
import type { Logger } from "pino";
import type { CommandOutcome, OutputStreamName } from "./host-protocol.js";

export interface UnclaimedBounds {
  /** How long a command's output or result is kept for a re-attach. */
  readonly ttlMs: number;
  /** Output kept per command; more is dropped and the command marked truncated. */
  readonly maxCommandBytes: number;
  /** Everything kept, output and results together. */
  readonly maxTotalBytes: number;
}

export interface ClaimedLeftovers {
  readonly outputs: readonly { readonly stream: OutputStreamName; readonly chunk: Uint8Array }[];
  readonly result: CommandOutcome | undefined;
  /** Some of the command's output was dropped before it was claimed. */
  readonly truncated: boolean;
}

interface Entry {
  readonly hostId: string;
  readonly outputs: { stream: OutputStreamName; chunk: Uint8Array }[];
  bytes: number;
  result: CommandOutcome | undefined;
  readonly at: number;
  truncated: boolean;
}

const MAX_COMMANDS = 256;
/** Commands dropped whole, remembered so a re-attach still reports them truncated. */
const MAX_DROPPED_IDS = 4096;
const resultBytes = (outcome: CommandOutcome): number => outcome.data.byteLength + outcome.outputTail.byteLength + outcome.error.length;

export class UnclaimedResults {
  private readonly entries = new Map<string, Entry>();
  private readonly dropped = new Set<string>();
  /** Bytes held now, output and results. */
  bytes = 0;

  constructor(
    private readonly bounds: UnclaimedBounds,
    private readonly log: Logger,
  ) {}

  addOutput(hostId: string, commandId: string, stream: OutputStreamName, chunk: Uint8Array): void {
    const entry = this.entry(hostId, commandId);
    if (entry.bytes + chunk.byteLength > this.bounds.maxCommandBytes) {
      entry.truncated = true;
      return;
    }
    this.makeRoom(chunk.byteLength, commandId);
    entry.outputs.push({ stream, chunk });
    entry.bytes += chunk.byteLength;
    this.bytes += chunk.byteLength;
  }

  setResult(hostId: string, outcome: CommandOutcome): void {
    const entry = this.entry(hostId, outcome.commandId);
    this.makeRoom(resultBytes(outcome), outcome.commandId);
    if (entry.result !== undefined) this.bytes -= resultBytes(entry.result);
    entry.result = outcome;
    this.bytes += resultBytes(outcome);
  }

  /** What was kept for the command from this host, taken out; undefined when nothing was. */
  claim(hostId: string, commandId: string): ClaimedLeftovers | undefined {
    const entry = this.entries.get(commandId)?.hostId === hostId ? this.forget(commandId) : undefined;
    const droppedWhole = this.dropped.delete(commandId);
    if (entry === undefined) return droppedWhole ? { outputs: [], result: undefined, truncated: true } : undefined;
    return { outputs: entry.outputs, result: entry.result, truncated: entry.truncated || droppedWhole };
  }

  private entry(hostId: string, commandId: string): Entry {
    const now = Date.now();
    for (const [id, entry] of this.entries) if (now - entry.at > this.bounds.ttlMs) this.forget(id, "nobody claimed it in time");
    let entry = this.entries.get(commandId);
    if (entry === undefined) {
      const oldest = this.entries.keys().next();
      if (this.entries.size >= MAX_COMMANDS && oldest.done !== true) this.forget(oldest.value, `over ${MAX_COMMANDS} unclaimed commands`);
      entry = { hostId, outputs: [], bytes: 0, result: undefined, at: now, truncated: false };
      this.entries.set(commandId, entry);
    }
    return entry;
  }

  /** Drops the oldest other commands until `bytes` more fit under the total bound. */
  private makeRoom(bytes: number, keep: string): void {
    for (const id of this.entries.keys()) {
      if (this.bytes + bytes <= this.bounds.maxTotalBytes) return;
      if (id !== keep) this.forget(id, `over the ${this.bounds.maxTotalBytes} byte bound on unclaimed output`);
    }
  }

  /** Forgets a command; with `why`, it was dropped unclaimed (logged, and remembered as truncated). */
  private forget(commandId: string, why?: string): Entry | undefined {
    const entry = this.entries.get(commandId);
    if (entry === undefined) return undefined;
    this.entries.delete(commandId);
    this.bytes -= entry.bytes + (entry.result === undefined ? 0 : resultBytes(entry.result));
    if (why !== undefined) {
      this.log.warn({ hostId: entry.hostId, commandId, bytes: entry.bytes, hadResult: entry.result !== undefined }, `unclaimed command output dropped: ${why}`);
      const oldest = this.dropped.values().next();
      if (this.dropped.size >= MAX_DROPPED_IDS && oldest.done !== true) this.dropped.delete(oldest.value);
      this.dropped.add(commandId);
    }
    return entry;
  }
}
