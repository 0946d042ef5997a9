// A replica's records for other replicas (commands, output, outcomes), stored by one writer so the
// records of each command are stored in the order they arose, in batches, with a high-water mark
// past which whoever feeds it (a host's output stream) is asked to wait.
import type { RelayRecord, SandboxRelayStore } from "./sandbox-relay-store.js";

/** Output queued for the ledger past which the host's stream is held. */
const HIGH_WATER_BYTES = 8 * 1024 * 1024;
const BATCH_BYTES = 2 * 1024 * 1024;

interface Queued {
  readonly record: RelayRecord;
  readonly bytes: number;
  readonly onFailed?: (error: Error) => void;
  /** The body as of the moment its batch is stored (everything queued before it is settled by then). */
  readonly finalBody?: () => Readonly<Record<string, unknown>>;
}

export interface RelayOutbox {
  /** Queues a record; `onFailed` hears if its batch could not be stored. */
  readonly post: (record: RelayRecord, onFailed?: (error: Error) => void, finalBody?: () => Readonly<Record<string, unknown>>) => void;
  /** A promise while the queue is over its high-water mark, settling once it is well below. */
  readonly backlog: () => Promise<void> | undefined;
}

export function createRelayOutbox(store: SandboxRelayStore, storeFailed: (error: Error, records: number) => void): RelayOutbox {
  const outbox: Queued[] = [];
  let outboxBytes = 0;
  let writing: Promise<void> | undefined;
  let drained: { promise: Promise<void>; resolve: () => void } | undefined;
  const drain = async (): Promise<void> => {
    while (outbox.length > 0) {
      let bytes = 0;
      let n = 0;
      while (n < outbox.length && (n === 0 || bytes + outbox[n]!.bytes <= BATCH_BYTES)) bytes += outbox[n++]!.bytes;
      const batch = outbox.splice(0, n);
      try {
        await store.append(batch.map((q) => (q.finalBody === undefined ? q.record : { ...q.record, body: q.finalBody() })));
      } catch (error) {
        const failure = error instanceof Error ? error : new Error(String(error));
        storeFailed(failure, batch.length);
        for (const q of batch) q.onFailed?.(failure);
      }
      outboxBytes -= bytes;
      if (drained !== undefined && outboxBytes <= HIGH_WATER_BYTES / 4) {
        drained.resolve();
        drained = undefined;
      }
    }
    writing = undefined;
  };
  return {
    post: (record, onFailed, finalBody) => {
      const bytes = JSON.stringify(record.body).length + 100;
      outbox.push({ record, bytes, ...(onFailed === undefined ? {} : { onFailed }), ...(finalBody === undefined ? {} : { finalBody }) });
      outboxBytes += bytes;
      writing ??= drain();
    },
    backlog: () => {
      if (outboxBytes <= HIGH_WATER_BYTES) return undefined;
      if (drained === undefined) {
        let resolve!: () => void;
        const promise = new Promise<void>((r) => (resolve = r));
        drained = { promise, resolve };
      }
      return drained.promise;
    },
  };
}
