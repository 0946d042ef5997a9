// The exec-class tools' port to sandbox hosts, in domain terms. The control plane's
// sandbox module implements it over SandboxService.Attach streams. When the host running a
// call goes away mid-call, its methods throw ToolOutcomeUnknownError.

import type { ObservationText } from "../domain/sandbox.js";

export interface WorkspaceGrant {
  readonly runId: string;
  readonly agentId: string;
  readonly image: string;
  readonly labels: readonly string[];
  readonly networkAccess: boolean;
  /** Secret values for this run's workspace only; never written to the ledger or logs. */
  readonly secrets: Readonly<Record<string, string>>;
  /**
   * For each secret, the control-plane variable its value came from. A workspace placed through
   * another replica is created with these names: that replica reads the values from its own
   * environment, so no value ever leaves the process that read it.
   */
  readonly secretSources: Readonly<Record<string, string>>;
}

export interface SandboxExec {
  readonly argv: readonly string[];
  readonly workingDirectory: string;
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  readonly maxOutputBytes: number;
  /** The calling worker's run-lease epoch: the host refuses it once a later holder has acted. */
  readonly leaseEpoch?: number;
}

export interface SandboxExecResult {
  readonly exitCode: number;
  readonly durationMs: number;
  readonly timedOut: boolean;
  readonly outputTruncated: boolean;
  /** Output bytes the command produced (up to the cap). */
  readonly outputBytes: number;
  /** The last few KiB of the output, already redacted: what the model is shown. */
  readonly outputTail: string;
}

export interface SandboxDispatcher {
  /** The run's workspace, placed on a host with capacity and matching labels on first use. */
  workspaceFor(grant: WorkspaceGrant, signal: AbortSignal): Promise<string>;
  /**
   * Runs a command; `onOutput` receives chunks (already redacted of the run's secrets) as the
   * host streams them. `commandId` is the tool invocation id, so a restarted control plane can
   * re-attach to a command that is still running.
   */
  exec(workspaceId: string, commandId: string, command: SandboxExec, onOutput: (stream: "stdout" | "stderr", text: ObservationText) => Promise<void>, signal: AbortSignal): Promise<SandboxExecResult>;
  readFile(workspaceId: string, path: string, maxBytes: number, signal: AbortSignal): Promise<Uint8Array>;
  writeFile(workspaceId: string, path: string, content: Uint8Array, signal: AbortSignal, leaseEpoch?: number): Promise<void>;
  listFiles(workspaceId: string, path: string, signal: AbortSignal): Promise<readonly { path: string; type: string; sizeBytes: number }[]>;
  /**
   * Waits for the outcome of an exec that outlived the worker (or the control-plane process)
   * that started it, by its command id. Undefined when no attached host knows the command.
   */
  reattach(grant: WorkspaceGrant, commandId: string, onOutput: (stream: "stdout" | "stderr", text: ObservationText) => Promise<void>, signal: AbortSignal): Promise<SandboxExecResult | undefined>;
  /** Releases the run's workspace now (the sweeper does it once the run ended and its inspection time passed). */
  releaseRun(runId: string): Promise<void>;
}
