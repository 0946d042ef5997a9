// SandboxDispatcher over the fleet of sandbox hosts: one workspace per run, placed in the
// ledger on a live host (attached to any replica) with capacity and matching labels, commands
// sent through the hub or, for a host another replica holds, through that replica
// (fleet-relay.ts), output persisted as it streams in and redacted of the run's secrets on the way.

import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { LeaseLostError } from "../domain/errors.js";
import { grantedSecrets, redactOutputTail, redactSecrets, type GrantedSecret, type ObservationText } from "../domain/sandbox.js";
import type { SandboxDispatcher, SandboxExecResult, WorkspaceGrant } from "../tools/sandbox-dispatcher.js";
import { ToolOutcomeUnknownError } from "../tools/tool-registry.js";
import type { CommandOutcome, HostCommand } from "./host-protocol.js";
import { createObservationPump } from "./observation-pump.js";
import type { FleetRelay } from "./fleet-relay.js";
import { HostLostError, HostUnavailableError, type CommandWatch, type SandboxHub } from "./sandbox-hub.js";
import type { FleetHost, SandboxFleetStore, WorkspaceLease } from "./workspace-lease-store.js";

export interface RemoteSandboxOptions {
  /** How long placement waits for an attached host with room before the tool fails. */
  readonly placementWaitMs: number;
  /** How long recovery waits for the host of an interrupted exec to attach again. */
  readonly reattachWaitMs: number;
  /** Output past this many bytes per exec is dropped and the call marked truncated. */
  readonly maxOutputBytes: number;
  /** Bound on an exec that is re-attached without knowing its own timeout. */
  readonly maxExecTimeoutMs: number;
  /** How long a finished run's workspace is kept for inspection. */
  readonly keepMs: number;
}

/** Time a host gets on top of a command's own timeout to report its outcome. */
const OUTCOME_SLACK_MS = 30_000;
/** Creating a workspace may mean creating and starting a container. */
const ACQUIRE_TIMEOUT_MS = 120_000;
const FILE_TIMEOUT_MS = 60_000;

export interface RemoteSandboxDispatcher extends SandboxDispatcher {
  /** The run's workspace if it has one whose host is attached (within the placement wait); never places one. */
  existingWorkspace(grant: WorkspaceGrant, signal: AbortSignal): Promise<string | undefined>;
  /** Releases workspaces whose run ended and whose inspection time passed; returns how many. */
  sweep(signal: AbortSignal): Promise<number>;
}

interface Known {
  readonly hostId: string;
  readonly runId: string;
  readonly secrets: readonly GrantedSecret[];
}

/** "k=v" needs the label with that value; "k" needs the label at all. */
export function labelsMatch(required: readonly string[], labels: Readonly<Record<string, string>>): boolean {
  return required.every((label) => {
    const at = label.indexOf("=");
    if (at < 0) return label in labels;
    return labels[label.slice(0, at)] === label.slice(at + 1);
  });
}

export function createRemoteSandboxDispatcher(
  hub: SandboxHub,
  fleet: FleetRelay,
  store: SandboxFleetStore,
  options: RemoteSandboxOptions,
  log: Logger,
): RemoteSandboxDispatcher {
  /** Workspaces this process has handed out: their host and the secrets to redact from their output. */
  const known = new Map<string, Known>();
  /** Per run, so one run never gets two workspaces. */
  const acquiring = new Map<string, Promise<string>>();

  /** Until the host is attached to some replica (this one's hub wakes early; others' are polled). */
  const waitAttached = async (hostId: string, waitMs: number, signal: AbortSignal): Promise<boolean> => {
    const deadline = Date.now() + waitMs;
    while (!(await fleet.reachable(hostId))) {
      const left = deadline - Date.now();
      if (left <= 0 || signal.aborted) return false;
      await hub.changed(Math.min(left, 250), signal);
    }
    return true;
  };

  /**
   * Asks the workspace's host for a command's outcome. A host looks attached through a replica
   * that has just died until that replica's record ages out, and may be attached nowhere a moment
   * later; the relay then sends nothing (HostUnavailableError), and the host is waited for again
   * until `deadline`, as it would have been had it looked gone from the start.
   */
  const askAgain = async (lease: WorkspaceLease, commandId: string, watch: CommandWatch, signal: AbortSignal, deadline: number): Promise<CommandOutcome> => {
    for (;;) {
      try {
        return await fleet.reattach(lease.hostId, lease.id, commandId, watch, signal, options.maxExecTimeoutMs + OUTCOME_SLACK_MS);
      } catch (error) {
        if (!(error instanceof HostUnavailableError) || Date.now() >= deadline) throw error;
        // A pause first: a host that still looks attached is not asked again in a tight loop.
        await hub.changed(Math.min(250, deadline - Date.now()), signal);
        if (!(await waitAttached(lease.hostId, deadline - Date.now(), signal))) throw error;
      }
    }
  };

  const failureText = (outcome: CommandOutcome, secrets: readonly GrantedSecret[]) =>
    redactSecrets(outcome.error || `failed (${outcome.errorReason || "no reason given"})`, secrets);

  /** Sends a file command; a host lost mid-call leaves the outcome unknown. */
  const fileCommand = async (workspaceId: string, action: HostCommand["action"], signal: AbortSignal, leaseEpoch?: number): Promise<CommandOutcome> => {
    const ws = known.get(workspaceId);
    if (ws === undefined) throw new Error(`workspace ${workspaceId} was not acquired through this control plane`);
    let outcome: CommandOutcome;
    try {
      outcome = await fleet.send(ws.hostId, { commandId: randomUUID(), action, ...(leaseEpoch === undefined ? {} : { leaseEpoch }) }, {}, signal, FILE_TIMEOUT_MS);
    } catch (error) {
      if (error instanceof HostLostError) throw new ToolOutcomeUnknownError(error.message);
      throw error;
    }
    if (!outcome.ok) throw new Error(failureText(outcome, ws.secrets));
    return outcome;
  };

  /** Live hosts that fit, most free slots first (this replica's own first among equals: no relay hop). */
  const candidates = (hosts: readonly FleetHost[], grant: WorkspaceGrant): FleetHost[] =>
    hosts
      .filter((host) => host.live || hub.isAttached(host.hostId))
      .filter((host) => labelsMatch(grant.labels, host.labels))
      .filter((host) => host.images.length === 0 || host.images.includes(grant.image))
      .map((host) => ({ host, free: host.capacity.workspaces - host.active, local: hub.isAttached(host.hostId) ? 0 : 1 }))
      .filter((c) => c.free > 0)
      .sort((a, b) => b.free - a.free || a.local - b.local || a.host.hostId.localeCompare(b.host.hostId))
      .map((c) => c.host);

  /**
   * Records the lease before anything is created. The ledger serializes placements per host
   * (placeWorkspace), so replicas placing at once never overbook one; a host found full there
   * since the read hands the placement to the next candidate.
   */
  const reserve = async (grant: WorkspaceGrant): Promise<WorkspaceLease | undefined> => {
    for (const host of candidates(await store.liveHosts(), grant)) {
      const lease = { id: randomUUID(), hostId: host.hostId, runId: grant.runId, image: grant.image };
      if (await store.placeWorkspace(lease)) return { ...lease, status: "active" as const };
    }
    return undefined;
  };

  /**
   * The run's active workspace, if it has one, and whether its host is attached to some replica
   * within `waitMs` (it may be reconnecting, or attaching to this process after a restart); an
   * attached one is known here from then on, with the secrets to redact from its output.
   */
  const activeOf = async (grant: WorkspaceGrant, waitMs: number, signal: AbortSignal): Promise<{ lease: WorkspaceLease; attached: boolean } | undefined> => {
    const lease = await store.activeWorkspaceOfRun(grant.runId);
    if (lease === undefined) return undefined;
    const attached = await waitAttached(lease.hostId, waitMs, signal);
    if (attached) known.set(lease.id, { hostId: lease.hostId, runId: grant.runId, secrets: grantedSecrets(grant.secrets) });
    return { lease, attached };
  };

  const acquire = async (grant: WorkspaceGrant, signal: AbortSignal): Promise<string> => {
    const secrets = grantedSecrets(grant.secrets);
    const active = await activeOf(grant, options.placementWaitMs, signal);
    if (active !== undefined) {
      const existing = active.lease;
      if (active.attached) return existing.id;
      signal.throwIfAborted();
      await store.finish(existing.id, "lost");
      log.warn({ runId: grant.runId, workspaceId: existing.id, hostId: existing.hostId }, "the run's workspace host did not come back; placing a new workspace");
    }

    const deadline = Date.now() + options.placementWaitMs;
    for (;;) {
      signal.throwIfAborted();
      const lease = await reserve(grant);
      if (lease !== undefined) {
        let outcome: CommandOutcome;
        try {
          outcome = await fleet.send(
            lease.hostId,
            {
              commandId: randomUUID(),
              action: {
                kind: "acquire",
                workspaceId: lease.id,
                runId: grant.runId,
                image: grant.image,
                networkAccess: grant.networkAccess,
                env: grant.secrets,
                envSources: grant.secretSources,
              },
            },
            {},
            signal,
            ACQUIRE_TIMEOUT_MS,
          );
        } catch (error) {
          await store.finish(lease.id, "failed");
          if (error instanceof HostLostError || error instanceof HostUnavailableError) {
            throw new Error(`the sandbox host went away while creating the workspace: ${error.message}`);
          }
          throw error;
        }
        if (!outcome.ok) {
          await store.finish(lease.id, "failed");
          throw new Error(`sandbox host ${lease.hostId} could not create a workspace from image ${grant.image}: ${failureText(outcome, secrets)}`);
        }
        known.set(lease.id, { hostId: lease.hostId, runId: grant.runId, secrets });
        log.info({ runId: grant.runId, workspaceId: lease.id, hostId: lease.hostId, image: grant.image }, "workspace acquired");
        return lease.id;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        const labels = grant.labels.length === 0 ? "" : ` and labels ${grant.labels.join(", ")}`;
        throw new Error(
          `no sandbox host with free capacity for image ${grant.image}${labels} was attached to any replica within ${Math.round(options.placementWaitMs / 1000)} s; start one with \`keel sandbox-agent\``,
        );
      }
      await hub.changed(Math.min(left, 500), signal);
    }
  };

  const runExec = async (
    secrets: readonly GrantedSecret[],
    onOutput: (stream: "stdout" | "stderr", text: ObservationText) => Promise<void>,
    send: (watch: CommandWatch) => Promise<CommandOutcome>,
  ): Promise<{ outcome: CommandOutcome; result: SandboxExecResult }> => {
    const pump = createObservationPump({ secrets, maxBytes: options.maxOutputBytes, sink: onOutput });
    let outcome: CommandOutcome;
    try {
      outcome = await send({ onOutput: (stream, chunk) => pump.push(stream, chunk), backlog: () => pump.backlog() });
    } catch (error) {
      await pump.finish(true).catch(() => {}); // keep what was observed before the host vanished
      if (error instanceof HostLostError) throw new ToolOutcomeUnknownError(error.message);
      if (error instanceof HostUnavailableError) throw new Error(`${error.message}; the command was not sent`);
      throw error;
    }
    try {
      await pump.finish(outcome.outputTruncated);
    } catch (error) {
      // The command ran to its end; only its record is incomplete. "Failed" would invite the
      // model to run a write again, so its outcome is unknown (a read's is interrupted).
      if (error instanceof LeaseLostError) throw error;
      const why = error instanceof Error ? error.message : String(error);
      throw new ToolOutcomeUnknownError(`the command ran (exit code ${outcome.exitCode}) but its output could not be recorded: ${why}`);
    }
    const tail = new TextDecoder().decode(outcome.outputTail);
    return {
      outcome,
      result: {
        exitCode: outcome.exitCode,
        durationMs: outcome.durationMs,
        timedOut: outcome.timedOut,
        outputTruncated: outcome.outputTruncated || pump.truncated,
        outputBytes: Math.max(outcome.outputBytes, pump.bytes),
        outputTail: redactOutputTail(tail, outcome.outputBytes > outcome.outputTail.byteLength, secrets, outcome.outputTruncated),
      },
    };
  };

  const release = async (lease: WorkspaceLease, why: string, signal: AbortSignal): Promise<boolean> => {
    if (await fleet.reachable(lease.hostId)) {
      try {
        const outcome = await fleet.send(lease.hostId, { commandId: randomUUID(), action: { kind: "release", workspaceId: lease.id } }, {}, signal, FILE_TIMEOUT_MS);
        if (!outcome.ok) log.warn({ workspaceId: lease.id, hostId: lease.hostId, error: outcome.error }, "host could not release a workspace; it reaps it later");
      } catch (error) {
        if (signal.aborted) return false;
        log.warn({ err: error, workspaceId: lease.id, hostId: lease.hostId }, "releasing a workspace failed; the host reaps it when it next registers");
      }
    } else if (await store.isHostConnected(lease.hostId)) {
      return false; // connected but not heard from lately: released once it is live again, or lost
    }
    known.delete(lease.id);
    const released = await store.finish(lease.id, "released");
    if (released) log.info({ workspaceId: lease.id, hostId: lease.hostId, runId: lease.runId, why }, "workspace released");
    return released;
  };

  return {
    async existingWorkspace(grant, signal) {
      const active = await activeOf(grant, options.placementWaitMs, signal);
      if (active === undefined) return undefined;
      if (!active.attached) throw new Error(`the host of run ${grant.runId}'s workspace, ${active.lease.hostId}, is not attached`);
      return active.lease.id;
    },

    workspaceFor(grant, signal) {
      const inFlight = acquiring.get(grant.runId);
      if (inFlight !== undefined) return inFlight;
      const attempt = acquire(grant, signal).finally(() => acquiring.delete(grant.runId));
      acquiring.set(grant.runId, attempt);
      return attempt;
    },

    async exec(workspaceId, commandId, command, onOutput, signal) {
      const ws = known.get(workspaceId);
      if (ws === undefined) throw new Error(`workspace ${workspaceId} was not acquired through this control plane`);
      const { outcome, result } = await runExec(ws.secrets, onOutput, (watch) =>
        fleet.send(
          ws.hostId,
          {
            commandId,
            action: {
              kind: "exec",
              workspaceId,
              argv: command.argv,
              workingDirectory: command.workingDirectory,
              env: command.env,
              timeoutMs: command.timeoutMs,
              maxOutputBytes: Math.min(command.maxOutputBytes, options.maxOutputBytes),
            },
            ...(command.leaseEpoch === undefined ? {} : { leaseEpoch: command.leaseEpoch }),
          },
          watch,
          signal,
          command.timeoutMs + OUTCOME_SLACK_MS,
        ),
      );
      if (!outcome.ok) throw new Error(failureText(outcome, ws.secrets));
      return result;
    },

    async reattach(grant, commandId, onOutput, signal) {
      const deadline = Date.now() + options.reattachWaitMs;
      const active = await activeOf(grant, options.reattachWaitMs, signal);
      if (active === undefined || !active.attached) return undefined;
      const lease = active.lease;
      const secrets = grantedSecrets(grant.secrets);
      const { outcome, result } = await runExec(secrets, onOutput, (watch) => askAgain(lease, commandId, watch, signal, deadline));
      if (outcome.unknownCommand) return undefined;
      if (!outcome.ok) throw new Error(failureText(outcome, secrets));
      log.info({ runId: grant.runId, commandId, hostId: lease.hostId }, "re-attached to a command that outlived its worker");
      return result;
    },

    async readFile(workspaceId, path, maxBytes, signal) {
      return (await fileCommand(workspaceId, { kind: "read_file", workspaceId, path, maxBytes }, signal)).data;
    },

    async writeFile(workspaceId, path, content, signal, leaseEpoch) {
      await fileCommand(workspaceId, { kind: "write_file", workspaceId, path, content }, signal, leaseEpoch);
    },

    async listFiles(workspaceId, path, signal) {
      const outcome = await fileCommand(workspaceId, { kind: "list_files", workspaceId, path }, signal);
      return JSON.parse(new TextDecoder().decode(outcome.data)) as { path: string; type: string; sizeBytes: number }[];
    },

    async releaseRun(runId) {
      const lease = await store.activeWorkspaceOfRun(runId);
      if (lease !== undefined) await release(lease, "released on request", AbortSignal.timeout(FILE_TIMEOUT_MS));
    },

    async sweep(signal) {
      let released = 0;
      for (const lease of await store.dueForRelease(options.keepMs, 50)) {
        if (signal.aborted) break;
        if (await release(lease, "the run ended and its inspection time passed", signal)) released += 1;
      }
      return released;
    },
  };
}
