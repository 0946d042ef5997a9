// Commands for a sandbox host whose Attach stream another control-plane replica holds. The
// sending replica stores the command in the ledger (sandbox_relays) and wakes the holding one
// with NOTIFY; that replica sends it down the stream as its own, and stores the output and the
// outcome for the sender the same way. A host attached here takes the hub's path, untouched.
//
// A command not taken within PICKUP_MS (its holder died, and its row still looks live for a few
// heartbeats) is withdrawn, which only succeeds if it was never taken, and sent again wherever the
// host is then. An acquire's secrets are never relayed: it carries the names of the control-plane
// variables they came from, and the holding replica reads the values from its own environment.
// Semantics follow the hub's: giving up on a command leaves it running on its host; a holding
// replica that fails or vanishes mid-command makes its outcome unknown (HostLostError); a
// command that never reached a host fails with HostUnavailableError.

import { setTimeout as delay } from "node:timers/promises";
import type { Logger } from "pino";
import type { CommandOutcome, HostCommand, OutputStreamName } from "./host-protocol.js";
import { b64, decodeCommand, decodeOutcome, encodeCommand, encodeOutcome, unb64 } from "./relay-encoding.js";
import { createRelayOutbox } from "./relay-outbox.js";
import { HostLostError, HostUnavailableError, type CommandWatch, type SandboxHub } from "./sandbox-hub.js";
import type { RelayKind, RelayRecord, SandboxRelayStore, TakenRelay } from "./sandbox-relay-store.js";

export interface FleetRelayOptions {
  readonly replicaId: string;
  /** The replica holding a host's live Attach stream, as the ledger says. */
  readonly route: (hostId: string) => Promise<string | undefined>;
  /** Subscribes to keel_sandbox; returns the unsubscribe. */
  readonly subscribe: (listener: (payload: string) => void) => () => void;
  /** Safety poll for a wake-up lost in a reconnect, while commands wait or hosts are attached here. */
  readonly pollMs: number;
  /** Where a relayed acquire's secrets are read, by the variable names it carries. */
  readonly environment: Readonly<Record<string, string | undefined>>;
}

export interface FleetRelay {
  /** The hub's send when the host is attached here; otherwise through the replica that holds it. */
  send(hostId: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome>;
  reattach(hostId: string, workspaceId: string, commandId: string, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome>;
  /** Whether the host is attached here or to another live replica. */
  reachable(hostId: string): Promise<boolean>;
  close(): void;
}

/** Past the holding replica's own timeout, how long the sender waits before the outcome is unknown. */
const ROUTE_SLACK_MS = 10_000;
const TAKE_BATCH = 200;
/** A holder that has not taken a command by then may be gone: the command is withdrawn and routed again. */
const PICKUP_MS = 3_000;
/** How long a command waits for its host to show up on some replica again after a failed hand-over. */
const REROUTE_WAIT_MS = 30_000;
/** Records nobody took within this long were meant for a replica that went away. */
const PRUNE_AFTER_MS = 10 * 60_000;

/** The holder never took the command: nothing ran. */
class NotTakenError extends HostUnavailableError {}

interface Waiting {
  readonly commandId: string;
  readonly hostId: string;
  /** The replica the command was handed to. */
  readonly holder: string;
  readonly watch: CommandWatch;
  /** Something came back for the command: its holder took it. */
  heard: boolean;
  /** Set once moved() ran: the move is under way. */
  moving: boolean;
  /** The host is now held by another replica (or this one): the old holder can no longer answer. */
  moved(): void;
  resolve(outcome: CommandOutcome): void;
  reject(error: Error): void;
}

export function createFleetRelay(hub: SandboxHub, store: SandboxRelayStore, options: FleetRelayOptions, log: Logger): FleetRelay {
  const me = options.replicaId;
  const waiting = new Map<string, Waiting>();
  const stopping = new AbortController();

  const { post, backlog: outboxBacklog } = createRelayOutbox(store, (error, records) => {
    if (!stopping.signal.aborted) log.warn({ err: error, records }, "sandbox relay: storing records for another replica failed");
  });

  /** A command for a host attached here; a re-attach collects what the host kept for it. */
  const local = (hostId: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number) =>
    command.action.kind === "reattach"
      ? hub.reattach(hostId, command.action.workspaceId, command.commandId, watch, signal, timeoutMs)
      : hub.send(hostId, command, watch, signal, timeoutMs);

  /** Holding side: runs a command another replica sent for a host attached here, and reports back. */
  const runForwarded = (body: Record<string, unknown>) => {
    const from = String(body["from"]);
    const hostId = String(body["hostId"]);
    const timeoutMs = Number(body["timeoutMs"]);
    const relayed = decodeCommand(body["command"] as Record<string, unknown>);
    const record = (kind: RelayKind, replyBody: Record<string, unknown>): RelayRecord => ({ toReplica: from, commandId: relayed.commandId, kind, body: replyBody });
    const reply = (kind: RelayKind, replyBody: Record<string, unknown>) => post(record(kind, replyBody));
    const secrets = secretsFor(relayed, options.environment, me);
    if (typeof secrets === "string") {
      reply("failed", { reason: "unavailable", message: secrets });
      return;
    }
    const command = secrets === undefined ? relayed : { ...relayed, action: { ...relayed.action, env: secrets } };
    // Output that could not be stored for the sender makes the outcome say truncated, never complete.
    let outputLost = false;
    const watch: CommandWatch = {
      onOutput: (stream, chunk) =>
        post(record("output", { stream, chunk: b64(chunk) }), () => {
          outputLost = true;
        }),
      backlog: outboxBacklog,
    };
    local(hostId, command, watch, stopping.signal, timeoutMs).then(
      (result) => {
        const encoded = encodeOutcome(result);
        post(record("result", encoded), undefined, () => (outputLost ? { ...encoded, outputTruncated: true } : encoded));
      },
      (error: unknown) => {
        // Shutting down, this replica lets go of the host: the sender collects the command
        // wherever the host attaches next, as after a crash, instead of hearing it was lost.
        if (stopping.signal.aborted) return;
        reply("failed", {
          // Only a command that was never sent is "unavailable"; anything else may have run.
          reason: error instanceof HostUnavailableError ? "unavailable" : "lost",
          message: error instanceof Error ? error.message : String(error),
        });
      },
    );
  };

  /** Sending side: output and the outcome of a command a holding replica ran for us. */
  const receive = async (taken: TakenRelay): Promise<void> => {
    if (taken.kind === "command") {
      runForwarded(taken.body);
      return;
    }
    const entry = waiting.get(taken.commandId);
    if (entry === undefined) return; // given up on (aborted or timed out): dropped, as the hub drops it
    entry.heard = true;
    switch (taken.kind) {
      case "output": {
        entry.watch.onOutput?.(taken.body["stream"] as OutputStreamName, unb64(taken.body["chunk"]));
        const backlog = entry.watch.backlog?.();
        if (backlog !== undefined) await backlog;
        return;
      }
      case "result":
        entry.resolve(decodeOutcome(taken.body));
        return;
      case "failed": {
        const message = String(taken.body["message"]);
        entry.reject(taken.body["reason"] === "unavailable" ? new HostUnavailableError(message) : new HostLostError(message));
        return;
      }
    }
  };

  // One taker per process, so records are handled in the order they were stored.
  let taking = false;
  let again = false;
  const wake = () => {
    if (taking) {
      again = true;
      return;
    }
    taking = true;
    void (async () => {
      try {
        do {
          again = false;
          for (;;) {
            const batch = await store.take(me, TAKE_BATCH);
            for (const taken of batch) {
              // Taken is deleted: one bad record must not cost the ones after it.
              await receive(taken).catch((error: unknown) => log.warn({ err: error, commandId: taken.commandId, kind: taken.kind }, "sandbox relay: a record could not be handled"));
            }
            if (batch.length < TAKE_BATCH) break;
          }
        } while (again && !stopping.signal.aborted);
      } catch (error) {
        if (!stopping.signal.aborted) log.warn({ err: error }, "sandbox relay: taking records failed; the next wake-up tries again");
      } finally {
        taking = false;
      }
    })();
  };

  const unsubscribe = options.subscribe((payload) => {
    if (payload === "" || payload === me) {
      wake();
      return;
    }
  });

  /**
   * A command's holder that went away mid-command (its host now attached elsewhere) will never
   * answer: its waiters are moved on at the next poll instead of waiting out their timeouts.
   */
  let checkingHolders = false;
  const checkHolders = async (): Promise<void> => {
    if (checkingHolders) return;
    checkingHolders = true;
    try {
      const holders = new Map<string, string | undefined>();
      for (const entry of [...waiting.values()]) {
        if (!holders.has(entry.hostId)) holders.set(entry.hostId, hub.isAttached(entry.hostId) ? me : await options.route(entry.hostId));
        const now = holders.get(entry.hostId);
        if (now !== undefined && now !== entry.holder && !entry.moving && waiting.get(entry.commandId) === entry) entry.moved();
      }
    } catch (error) {
      if (!stopping.signal.aborted) log.warn({ err: error }, "sandbox relay: checking command holders failed; the next poll tries again");
    } finally {
      checkingHolders = false;
    }
  };

  let polls = 0;
  const poller = setInterval(() => {
    if (waiting.size > 0 || hub.hosts().length > 0) wake();
    if (waiting.size > 0) void checkHolders();
    if (++polls % Math.max(1, Math.round(60_000 / options.pollMs)) === 0) {
      store.prune(PRUNE_AFTER_MS).catch((error: unknown) => log.warn({ err: error }, "sandbox relay: pruning failed"));
    }
  }, options.pollMs);
  poller.unref();

  /** Sends through the replica holding the host; waits for the outcome as hub.send does. */
  const viaReplica = (replica: string, hostId: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number) =>
    new Promise<CommandOutcome>((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason as Error);
        return;
      }
      const commandId = command.commandId;
      const sentAt = Date.now();
      const finish = () => {
        clearTimeout(timer);
        clearTimeout(pickup.timer);
        signal.removeEventListener("abort", onAbort);
        if (waiting.get(commandId) === entry) waiting.delete(commandId);
      };
      const entry: Waiting = {
        commandId,
        hostId,
        holder: replica,
        watch,
        heard: false,
        resolve: (outcome) => (finish(), resolve(outcome)),
        reject: (error) => (finish(), reject(error)),
        moving: false,
        moved: () => {
          entry.moving = true;
          clearTimeout(pickup.timer);
          const collect = () => {
            if (waiting.get(commandId) !== entry) return;
            finish();
            recollect(hostId, replica, command, watch, signal, Math.max(1, timeoutMs - (Date.now() - sentAt))).then(resolve, reject);
          };
          if (entry.heard) return collect();
          // Never taken (the withdrawal wins): nothing ran, and it is sent again where the host is now.
          store.withdraw(replica, commandId).then(
            (withdrawn) => (withdrawn ? entry.reject(new NotTakenError(`replica ${replica} lost sandbox host ${hostId} before taking command ${commandId}`)) : collect()),
            (error: unknown) => log.warn({ err: error, commandId }, "sandbox relay: withdrawing a command failed; waiting for its outcome"),
          );
        },
      };
      const onAbort = () => entry.reject(signal.reason as Error);
      const timer = setTimeout(
        () => entry.reject(new HostLostError(`sandbox host ${hostId} (attached to replica ${replica}) gave no outcome for command ${commandId} within ${timeoutMs} ms`)),
        timeoutMs + ROUTE_SLACK_MS,
      );
      timer.unref();
      const pickup: { timer?: NodeJS.Timeout } = {};
      signal.addEventListener("abort", onAbort, { once: true });
      waiting.get(commandId)?.reject(new Error(`command ${commandId} was re-attached elsewhere`));
      waiting.set(commandId, entry);
      const action = command.action;
      if (action.kind === "acquire" && Object.keys(action.env).some((name) => action.envSources?.[name] === undefined)) {
        // Fail closed: a value without the name of its source would have to travel itself.
        entry.reject(new HostUnavailableError(`sandbox host ${hostId} is attached to replica ${replica}, and this workspace's secrets do not say where they came from`));
        return;
      }
      const body = { from: me, hostId, timeoutMs, command: encodeCommand(command) };
      // A failed store may still have committed (a connection lost at COMMIT): the command may run, so its outcome is unknown.
      post({ toReplica: replica, commandId, kind: "command", body }, (error) => entry.reject(new HostLostError(`could not hand command ${commandId} to replica ${replica}: ${error.message}`)));
      pickup.timer = setTimeout(() => {
        if (entry.heard || waiting.get(commandId) !== entry) return;
        store.withdraw(replica, commandId).then(
          (withdrawn) => withdrawn && entry.reject(new NotTakenError(`replica ${replica} did not take command ${commandId} within ${PICKUP_MS} ms`)),
          (error: unknown) => log.warn({ err: error, commandId }, "sandbox relay: withdrawing a command failed; waiting for its outcome"),
        );
      }, PICKUP_MS);
      pickup.timer.unref();
    });

  /**
   * Through whichever replica holds the host. A hand-over that provably sent nothing (the holder
   * no longer had the host, or never took the command) is tried again wherever the host is, for
   * a bounded time; a host attached nowhere at the first try fails at once, as the hub's send does.
   */
  const remote = async (hostId: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome> => {
    const deadline = Date.now() + Math.min(timeoutMs, REROUTE_WAIT_MS);
    let failed: HostUnavailableError | undefined;
    for (;;) {
      if (hub.isAttached(hostId)) return local(hostId, command, watch, signal, timeoutMs);
      const replica = await options.route(hostId);
      if (replica !== undefined && replica !== me) {
        try {
          return await viaReplica(replica, hostId, command, watch, signal, timeoutMs);
        } catch (error) {
          if (!(error instanceof HostUnavailableError)) throw error;
          failed = error;
        }
      } else if (failed === undefined) {
        throw new HostUnavailableError(`sandbox host ${hostId} is not attached to any control-plane replica`);
      }
      if (Date.now() >= deadline) throw failed;
      await delay(250, undefined, { signal }).catch(() => undefined);
      signal.throwIfAborted();
    }
  };

  /**
   * A command whose holder went away mid-command, now that another replica (or this one) holds
   * its host. An exec goes on running on the host, so its outcome is collected where the host is
   * now; reads are asked again; anything else may or may not have happened: its outcome is unknown.
   */
  const recollect = (hostId: string, holder: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome> => {
    const action = command.action;
    log.info({ hostId, commandId: command.commandId, holder, kind: action.kind }, "sandbox relay: the command's holder lost its host; collecting the command where the host is now");
    // remote() takes the hub's own path when the host is now attached here.
    if (action.kind === "exec" || action.kind === "reattach") {
      return remote(hostId, { commandId: command.commandId, action: { kind: "reattach", workspaceId: action.workspaceId } }, watch, signal, timeoutMs);
    }
    if (action.kind === "read_file" || action.kind === "list_files") return remote(hostId, command, watch, signal, timeoutMs);
    return Promise.reject(
      new HostLostError(`replica ${holder}, which held sandbox host ${hostId}, lost it during command ${command.commandId} (${action.kind}): its outcome is unknown`),
    );
  };

  return {
    send(hostId, command, watch, signal, timeoutMs) {
      if (hub.isAttached(hostId)) return hub.send(hostId, command, watch, signal, timeoutMs);
      return remote(hostId, command, watch, signal, timeoutMs);
    },

    reattach(hostId, workspaceId, commandId, watch, signal, timeoutMs) {
      if (hub.isAttached(hostId)) return hub.reattach(hostId, workspaceId, commandId, watch, signal, timeoutMs);
      return remote(hostId, { commandId, action: { kind: "reattach", workspaceId } }, watch, signal, timeoutMs);
    },

    async reachable(hostId) {
      if (hub.isAttached(hostId)) return true;
      const replica = await options.route(hostId);
      return replica !== undefined && replica !== me;
    },

    close() {
      stopping.abort(new Error("the control plane is shutting down"));
      unsubscribe();
      clearInterval(poller);
    },
  };
}

/**
 * A relayed acquire's secrets, read from this replica's environment by the names it carries;
 * undefined for any other command, or a message saying which variable this replica lacks.
 */
function secretsFor(command: HostCommand, environment: Readonly<Record<string, string | undefined>>, replicaId: string): Record<string, string> | string | undefined {
  if (command.action.kind !== "acquire" || command.action.envSources === undefined) return undefined;
  const secrets: Record<string, string> = {};
  for (const [name, source] of Object.entries(command.action.envSources)) {
    const value = environment[source];
    if (value === undefined || value === "") {
      return `control-plane replica ${replicaId}, which holds the sandbox host, has no ${source} in its environment for the workspace's secret ${name}: give every replica the same secret variables`;
    }
    secrets[name] = value;
  }
  return secrets;
}
