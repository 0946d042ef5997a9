// The exec-class tools' port to sandbox hosts, in domain terms. The control plane's
// sandbox module implements it over SandboxService.Attach streams.

export interface WorkspaceGrant {
  readonly runId: string;
  readonly agentId: string;
  readonly image: string;
  readonly labels: readonly string[];
  readonly networkAccess: boolean;
  /** Secret values for this run's workspace only; never written to the ledger or logs. */
  readonly secrets: Readonly<Record<string, string>>;
}

export interface SandboxExec {
  readonly argv: readonly string[];
  readonly workingDirectory: string;
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  readonly maxOutputBytes: number;
}

export interface SandboxExecResult {
  readonly exitCode: number;
  readonly durationMs: number;
  readonly timedOut: boolean;
  readonly outputTruncated: boolean;
}

export interface SandboxDispatcher {
  /** The run's workspace, placed on a host with capacity and matching labels on first use. */
  workspaceFor(grant: WorkspaceGrant, signal: AbortSignal): Promise<string>;
  /**
   * Runs a command; `onOutput` receives chunks (already redacted of the run's secrets) as the
   * host streams them. `commandId` is the tool invocation id, so a restarted control plane can
   * re-attach to a command that is still running.
   */
  exec(workspaceId: string, commandId: string, command: SandboxExec, onOutput: (stream: "stdout" | "stderr", text: string) => Promise<void>, signal: AbortSignal): Promise<SandboxExecResult>;
  readFile(workspaceId: string, path: string, maxBytes: number, signal: AbortSignal): Promise<Uint8Array>;
  writeFile(workspaceId: string, path: string, content: Uint8Array, signal: AbortSignal): Promise<void>;
  listFiles(workspaceId: string, path: string, signal: AbortSignal): Promise<readonly { path: string; type: string; sizeBytes: number }[]>;
  /** Releases the run's workspace (kept for inspection for a configured time). */
  releaseRun(runId: string): Promise<void>;
}
