// The sandbox host's port to whatever materializes workspaces, in sandbox terms.
// Implementations: docker/docker-workspace-backend.ts (hardened containers) and
// process/process-workspace-backend.ts (a local folder and child processes; weaker isolation).

export interface WorkspaceLimits {
  readonly memoryBytes: number;
  readonly nanoCpus: number;
  readonly pids: number;
  /** Size of the writable /tmp tmpfs. */
  readonly tmpfsBytes: number;
}

export const DEFAULT_WORKSPACE_LIMITS: WorkspaceLimits = {
  memoryBytes: 512 * 1024 * 1024,
  nanoCpus: 1_000_000_000,
  pids: 256,
  tmpfsBytes: 64 * 1024 * 1024,
};

export interface WorkspaceSpec {
  readonly workspaceId: string;
  readonly runId: string;
  readonly image: string;
  /** Off unless the agent's policy grants it. */
  readonly networkAccess: boolean;
  /** Granted credentials and other variables, visible to this workspace only. */
  readonly env: Readonly<Record<string, string>>;
  readonly limits: WorkspaceLimits;
}

export interface ExecRequest {
  readonly commandId: string;
  readonly argv: readonly string[];
  /** Inside /workspace; traversal outside it is refused. */
  readonly workingDirectory: string;
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  /** Output past this many bytes (stdout and stderr together) is dropped and the result marked truncated. */
  readonly maxOutputBytes: number;
  /**
   * Asked after each chunk of output: a promise means whoever takes the output is behind, and
   * the backend may stop reading the command's output until it settles (the command then blocks
   * on a full pipe). A command past its timeout or aborted is drained regardless. Optional.
   */
  readonly outputBacklog?: () => Promise<void> | undefined;
}

export type OutputStreamName = "stdout" | "stderr";

export interface ExecResult {
  readonly exitCode: number;
  readonly durationMs: number;
  readonly timedOut: boolean;
  readonly outputTruncated: boolean;
}

export interface FileEntry {
  readonly path: string;
  readonly type: "file" | "directory" | "other";
  readonly sizeBytes: number;
}

export interface WorkspaceSummary {
  readonly workspaceId: string;
  readonly runId: string;
}

export class WorkspaceError extends Error {
  constructor(
    readonly reason: "not_found" | "path_outside_workspace" | "too_large" | "backend_failure",
    message: string,
  ) {
    super(message);
  }
}

export interface WorkspaceBackend {
  readonly name: "docker" | "process";
  /** Creates (or takes from a warm pool) and starts the workspace. Idempotent on workspaceId. */
  acquire(spec: WorkspaceSpec, signal: AbortSignal): Promise<void>;
  /** Runs a command, streaming output chunks as they come; never holds the whole output in memory. */
  exec(workspaceId: string, request: ExecRequest, onOutput: (stream: OutputStreamName, chunk: Uint8Array) => void, signal: AbortSignal): Promise<ExecResult>;
  readFile(workspaceId: string, path: string, maxBytes: number): Promise<Uint8Array>;
  writeFile(workspaceId: string, path: string, content: Uint8Array): Promise<void>;
  listFiles(workspaceId: string, path: string): Promise<readonly FileEntry[]>;
  release(workspaceId: string): Promise<void>;
  /** Workspaces this backend has on this host (found by label or folder), for reconnect announcements. */
  list(): Promise<readonly WorkspaceSummary[]>;
  /** Removes every workspace of this host that `keep` rejects; returns the removed ids. */
  reap(keep: (workspaceId: string) => boolean): Promise<readonly string[]>;
  close(): Promise<void>;
}
