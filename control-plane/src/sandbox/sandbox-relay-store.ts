// The fleet relay's port to the ledger: messages between control-plane replicas about sandbox
// commands, kept until their recipient takes them, and wake-ups that are never stored.

export type RelayKind = "command" | "output" | "result" | "failed";

export interface RelayRecord {
  readonly toReplica: string;
  readonly commandId: string;
  readonly kind: RelayKind;
  readonly body: Readonly<Record<string, unknown>>;
}

export interface TakenRelay {
  readonly commandId: string;
  readonly kind: RelayKind;
  readonly body: Readonly<Record<string, unknown>>;
}

export interface SandboxRelayStore {
  /** Stores the records, in order, and wakes each recipient (keel_sandbox, payload: its replica id). */
  append(records: readonly RelayRecord[]): Promise<void>;
  /** Removes and returns up to `limit` records addressed to the replica, oldest first. */
  take(replicaId: string, limit: number): Promise<TakenRelay[]>;
  /**
   * Deletes a command record its recipient has not taken yet; false when it was taken (or never
   * stored). Exactly one of the two wins, so a withdrawn command never runs.
   */
  withdraw(toReplica: string, commandId: string): Promise<boolean>;
  /** Drops records older than `maxAgeMs` (their recipient went away); returns how many. */
  prune(maxAgeMs: number): Promise<number>;
}
