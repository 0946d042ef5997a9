// The sandbox hosts attached to this control-plane process: one session per host (its Attach
// stream), a command queue per session, and the commands waiting for their outcome.
//
// A host that drops off is given a short grace to come back (a restarted stream, a network
// blip): commands it still runs are picked up again by id. Past the grace, or when the host
// comes back as a different process, its commands' outcomes are unknown and its workspaces lost.
//
// A live session is taken over only by the same agent process on a new stream: same token and
// same instance id. The instance id is a random UUID the agent draws at start and sends only at
// registration, so it is that process's proof; any other registrant is refused while the
// session lives, and never receives its re-attach commands or its workspaces.

import type { Logger } from "pino";
import { FailedPreconditionError } from "../domain/errors.js";
import type { CommandOutcome, HostCommand, HostMessage, HostRegistered, HostRegistration, OutputStreamName } from "./host-protocol.js";
import { HostSession } from "./host-session.js";
import { UnclaimedResults } from "./unclaimed-results.js";
import type { HostCapacity, WorkspaceLeaseStore } from "./workspace-lease-store.js";

/** The host running a command went away (or never answered): whether the command took effect is unknown. */
export class HostLostError extends Error {}

/** The host is not attached here: nothing was sent. */
export class HostUnavailableError extends Error {}

/** Who registers a host: the token it authenticated with. */
export interface HostClaimant {
  readonly tokenId: string;
}

export interface SandboxHubOptions {
  readonly heartbeatIntervalMs: number;
  /** How long a departed host's commands wait for it to re-attach before their outcome is unknown. */
  readonly reconnectGraceMs: number;
  /** How long output or a result that nobody waits for is kept for a re-attach. */
  readonly unclaimedTtlMs: number;
  /** Bound on what is kept per unclaimed command. */
  readonly maxUnclaimedBytes: number;
  /** Bound on everything kept unclaimed, output and results together (default 16 × maxUnclaimedBytes). */
  readonly maxUnclaimedTotalBytes?: number;
}

export interface HostView {
  readonly hostId: string;
  readonly capacity: HostCapacity;
  readonly labels: Readonly<Record<string, string>>;
  readonly images: readonly string[];
  readonly backends: readonly string[];
}

export interface CommandWatch {
  /** Called synchronously, in order, for each output chunk of the command. */
  readonly onOutput?: (stream: OutputStreamName, chunk: Uint8Array) => void;
  /**
   * Asked after each chunk: a promise means the consumer is behind, and the host's stream is
   * held (nothing more read from that host) until it settles, for a bounded time (host-session.ts).
   */
  readonly backlog?: () => Promise<void> | undefined;
}

export interface AttachedHost {
  readonly registered: HostRegistered;
  /** Commands for the host, in order; ends when the session closes. */
  readonly commands: AsyncIterable<HostCommand>;
  receive(message: HostMessage): void;
  /** After receive(): a promise when the stream should not be read further until it settles. */
  holdOff(): Promise<void> | undefined;
  /** The stream ended or failed. */
  close(reason: string): void;
}

export interface SandboxHub {
  /** Refuses (FailedPreconditionError) a registration that would take over another instance's live session. */
  attach(registration: HostRegistration, claimant?: HostClaimant): Promise<AttachedHost>;
  hosts(): HostView[];
  isAttached(hostId: string): boolean;
  /** Resolves at the next registration, heartbeat or departure, or after `timeoutMs`. */
  changed(timeoutMs: number, signal: AbortSignal): Promise<void>;
  /** Sends a command and waits for its outcome; `timeoutMs` bounds the wait (then the outcome is unknown). */
  send(hostId: string, command: HostCommand, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome>;
  /** Waits for the outcome of a command sent earlier (perhaps by another process), by its id. */
  reattach(hostId: string, workspaceId: string, commandId: string, watch: CommandWatch, signal: AbortSignal, timeoutMs: number): Promise<CommandOutcome>;
  /** Stops taking hosts; commands still waiting end with their callers' signals or timeouts. */
  close(): void;
}

interface Pending {
  readonly commandId: string;
  readonly hostId: string;
  readonly watch: CommandWatch;
  readonly workspaceId: string;
  /** Output of this command was dropped while nobody waited for it: its outcome says truncated. */
  outputLost?: boolean;
  resolve(outcome: CommandOutcome): void;
  reject(error: Error): void;
}

export function createSandboxHub(store: WorkspaceLeaseStore, options: SandboxHubOptions, log: Logger): SandboxHub {
  const sessions = new Map<string, HostSession>();
  /** The agent process (and its token) each host last registered with, while this control plane has known it. */
  const instances = new Map<string, { instanceId: string; tokenId: string }>();
  const departed = new Map<string, NodeJS.Timeout>();
  const pending = new Map<string, Pending>();
  const unclaimed = new UnclaimedResults(
    { ttlMs: options.unclaimedTtlMs, maxCommandBytes: options.maxUnclaimedBytes, maxTotalBytes: options.maxUnclaimedTotalBytes ?? options.maxUnclaimedBytes * 16 },
    log,
  );
  const registering = new Map<string, Promise<void>>();
  const listeners = new Set<() => void>();
  let closing = false;

  const notify = () => {
    for (const listener of [...listeners]) listener();
  };
  const background = (what: string, work: Promise<unknown>) =>
    void work.catch((error: unknown) => {
      if (!closing) log.warn({ err: error }, `sandbox hub: ${what} failed`);
    });

  const pendingOf = (hostId: string) => [...pending.values()].filter((p) => p.hostId === hostId);
  const fail = (entry: Pending, error: Error) => {
    if (pending.get(entry.commandId) === entry) pending.delete(entry.commandId);
    entry.reject(error);
  };

  const liveness = setInterval(() => {
    const limit = options.heartbeatIntervalMs * 3;
    for (const session of sessions.values()) {
      if (!session.held && Date.now() - session.lastSeenAt > limit) session.close(`no heartbeat for ${limit} ms`);
    }
  }, options.heartbeatIntervalMs);
  liveness.unref();

  const departure = (session: HostSession, reason: string) => {
    const hostId = session.registration.hostId;
    if (closing || sessions.get(hostId) !== session) return; // replaced by a newer registration
    sessions.delete(hostId);
    log.info({ hostId, reason }, "sandbox host detached");
    background("recording a host departure", store.hostDisconnected(hostId));
    notify();
    departed.set(
      hostId,
      setTimeout(() => {
        departed.delete(hostId);
        if (sessions.has(hostId)) return;
        const why = `sandbox host ${hostId} went away (${reason}) and did not come back within ${options.reconnectGraceMs} ms`;
        for (const entry of pendingOf(hostId)) fail(entry, new HostLostError(why));
        // Unless it attached to another replica meanwhile: then its workspaces live on there.
        background(
          "marking a departed host's workspaces lost",
          store.markLostIfDetached(hostId).then((ids) => {
            if (ids.length > 0) log.warn({ hostId, workspaceIds: ids }, "workspaces of a departed sandbox host marked lost");
          }),
        );
      }, options.reconnectGraceMs),
    );
  };

  const receive = (session: HostSession, message: HostMessage): void => {
    const hostId = session.registration.hostId;
    session.lastSeenAt = Date.now();
    switch (message.kind) {
      case "heartbeat":
        background("recording a heartbeat", store.heartbeat(hostId));
        notify();
        return;
      case "output": {
        const entry = pending.get(message.commandId);
        if (entry !== undefined && entry.hostId === hostId) {
          entry.watch.onOutput?.(message.stream, message.chunk);
          session.backlog = entry.watch.backlog?.();
          return;
        }
        unclaimed.addOutput(hostId, message.commandId, message.stream, message.chunk);
        return;
      }
      case "result": {
        const entry = pending.get(message.outcome.commandId);
        if (entry !== undefined && entry.hostId === hostId) {
          pending.delete(entry.commandId);
          entry.resolve(entry.outputLost === true ? { ...message.outcome, outputTruncated: true } : message.outcome);
          return;
        }
        unclaimed.setResult(hostId, message.outcome);
        return;
      }
    }
  };

  /** Registers a waiter for a command; a newer waiter for the same id supersedes an older one. */
  const wait = (
    hostId: string,
    workspaceId: string,
    commandId: string,
    watch: CommandWatch,
    signal: AbortSignal,
    timeoutMs: number,
    start: (entry: Pending) => void,
  ): Promise<CommandOutcome> =>
    new Promise<CommandOutcome>((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason as Error);
        return;
      }
      const previous = pending.get(commandId);
      if (previous !== undefined) fail(previous, new Error(`command ${commandId} was re-attached elsewhere`));
      const finish = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
      };
      const entry: Pending = {
        commandId,
        hostId,
        workspaceId,
        watch,
        resolve: (outcome) => (finish(), resolve(outcome)),
        reject: (error) => (finish(), reject(error)),
      };
      // Giving up on a command leaves it running on its host: a later re-attach may still collect it.
      const onAbort = () => fail(entry, signal.reason as Error);
      const timer = setTimeout(() => fail(entry, new HostLostError(`sandbox host ${hostId} gave no outcome for command ${commandId} within ${timeoutMs} ms`)), timeoutMs);
      timer.unref();
      signal.addEventListener("abort", onAbort, { once: true });
      pending.set(commandId, entry);
      start(entry);
    });

  const register = async (registration: HostRegistration, claimant: HostClaimant): Promise<AttachedHost> => {
    const hostId = registration.hostId;
    const previousSession = sessions.get(hostId);
    const last = instances.get(hostId);
    const sameProcess = last !== undefined && last.instanceId === registration.instanceId && last.tokenId === claimant.tokenId;
    if (previousSession !== undefined && !previousSession.closed && !sameProcess) {
      throw new FailedPreconditionError(
        `sandbox host ${hostId} is attached by another live agent instance; a new instance may register once that session ends ` +
          `(its stream closes or ${options.heartbeatIntervalMs * 3} ms pass without a heartbeat) or its token is revoked`,
      );
    }
    // The same guard across replicas: a live session elsewhere is taken over only by its own agent
    // process (same instance id), which is how a host moves to another replica.
    const elsewhere = await store.instanceAttachedElsewhere(hostId);
    if (elsewhere !== undefined && elsewhere !== registration.instanceId) {
      throw new FailedPreconditionError(
        `sandbox host ${hostId} is attached to another control-plane replica by another live agent instance; a new instance may ` +
          `register once that session ends (its stream closes or ${options.heartbeatIntervalMs * 3} ms pass without a heartbeat)`,
      );
    }
    if (previousSession !== undefined) {
      sessions.delete(hostId); // replaced, not departed: its commands carry over
      previousSession.close("replaced by a new registration of the same host");
    }
    const recorded = await store.registerHost({
      hostId,
      instanceId: registration.instanceId,
      capacity: registration.capacity,
      labels: registration.labels,
      backends: registration.backends,
      images: registration.images,
    });
    const known = last?.instanceId ?? recorded;
    // A process holds one token: another token is another process, whatever instance id it shows,
    // so it gets none of the previous one's re-attach commands or workspaces.
    const otherToken = last !== undefined && last.tokenId !== claimant.tokenId;
    const restarted = otherToken || (known !== undefined && known !== "" && known !== registration.instanceId);
    instances.set(hostId, { instanceId: registration.instanceId, tokenId: claimant.tokenId });
    clearTimeout(departed.get(hostId));
    departed.delete(hostId);

    const announced = registration.running.map((w) => w.workspaceId);
    let reap: string[];
    if (restarted) {
      // A new agent process: whatever the old one ran is gone, and so are its leases.
      for (const entry of pendingOf(hostId)) fail(entry, new HostLostError(`sandbox host ${hostId} restarted while running command ${entry.commandId}`));
      const lost = await store.markLost(hostId, "all");
      if (lost.length > 0) log.warn({ hostId, workspaceIds: lost }, "sandbox host restarted; its workspaces are lost");
      reap = announced;
    } else {
      const active = new Set(await store.activeWorkspaceIdsOfHost(hostId));
      const has = new Set(announced);
      reap = announced.filter((id) => !active.has(id));
      const missing = [...active].filter((id) => !has.has(id));
      if (missing.length > 0) {
        await store.markLost(hostId, missing);
        log.warn({ hostId, workspaceIds: missing }, "sandbox host no longer has these workspaces; marked lost");
      }
    }

    const session = new HostSession(registration, departure);
    sessions.set(hostId, session);
    // Same process, new stream: ask again for every command still waiting on this host.
    for (const entry of pendingOf(hostId)) session.push({ commandId: entry.commandId, action: { kind: "reattach", workspaceId: entry.workspaceId } });
    log.info(
      { hostId, instanceId: `${registration.instanceId.slice(0, 8)}…`, capacity: registration.capacity, labels: registration.labels, reap: reap.length, restarted },
      "sandbox host attached",
    );
    notify();
    return {
      registered: { hostId, heartbeatIntervalMs: options.heartbeatIntervalMs, reapWorkspaceIds: reap },
      commands: session.commands(),
      receive: (message) => receive(session, message),
      holdOff: () => session.holdOff(),
      close: (reason) => session.close(reason),
    };
  };

  return {
    attach(registration, claimant = { tokenId: "" }) {
      // One registration of a host at a time, so two registrants cannot both pass the takeover check.
      const hostId = registration.hostId;
      const turn = (registering.get(hostId) ?? Promise.resolve()).then(() => register(registration, claimant));
      const settled = turn.then(() => {}, () => {});
      registering.set(hostId, settled);
      void settled.then(() => registering.get(hostId) === settled && registering.delete(hostId));
      return turn;
    },

    hosts: () =>
      [...sessions.values()].map(({ registration: r }) => ({
        hostId: r.hostId,
        capacity: r.capacity,
        labels: r.labels,
        images: r.images,
        backends: r.backends,
      })),

    isAttached: (hostId) => sessions.has(hostId),

    changed(timeoutMs, signal) {
      return new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          listeners.delete(done);
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, timeoutMs);
        listeners.add(done);
        signal.addEventListener("abort", done, { once: true });
      });
    },

    send(hostId, command, watch, signal, timeoutMs) {
      const session = sessions.get(hostId);
      if (session === undefined) return Promise.reject(new HostUnavailableError(`sandbox host ${hostId} is not attached`));
      const workspaceId = command.action.workspaceId;
      return wait(hostId, workspaceId, command.commandId, watch, signal, timeoutMs, () => session.push(command));
    },

    reattach(hostId, workspaceId, commandId, watch, signal, timeoutMs) {
      const session = sessions.get(hostId);
      if (session === undefined) return Promise.reject(new HostUnavailableError(`sandbox host ${hostId} is not attached`));
      return wait(hostId, workspaceId, commandId, watch, signal, timeoutMs, (entry) => {
        // What arrived while nobody waited (output flushed by a host that reconnected) comes first.
        const kept = unclaimed.claim(hostId, commandId);
        // Output dropped while nobody waited for it makes the outcome truncated.
        if (kept?.truncated === true) entry.outputLost = true;
        if (kept !== undefined) {
          for (const output of kept.outputs) watch.onOutput?.(output.stream, output.chunk);
          if (kept.result !== undefined) {
            pending.delete(commandId);
            entry.resolve(entry.outputLost === true ? { ...kept.result, outputTruncated: true } : kept.result);
            return;
          }
        }
        session.push({ commandId, action: { kind: "reattach", workspaceId } });
      });
    },

    close() {
      closing = true;
      clearInterval(liveness);
      for (const timer of departed.values()) clearTimeout(timer);
      departed.clear();
      // Waiting calls are left to their own signals: a worker stopping hands its run back
      // and the command's outcome is collected by a re-attach, never declared unknown here.
      for (const session of [...sessions.values()]) session.close("the control plane is shutting down");
      sessions.clear();
    },
  };
}
