// What the control plane and a sandbox host say to each other over SandboxService.Attach,
// in the sandbox module's own terms; api/sandbox-service.ts converts to and from proto.

import type { HostRecord } from "./workspace-lease-store.js";

export interface RunningWorkspace {
  readonly workspaceId: string;
  readonly runId: string;
  readonly runningCommandIds: readonly string[];
}

/** What the ledger keeps of a host, plus what it is running as it (re)attaches. */
export interface HostRegistration extends HostRecord {
  readonly running: readonly RunningWorkspace[];
  readonly agentVersion: string;
}

export interface HostRegistered {
  readonly hostId: string;
  readonly heartbeatIntervalMs: number;
  readonly reapWorkspaceIds: readonly string[];
}

export type HostAction =
  | {
      readonly kind: "acquire";
      readonly workspaceId: string;
      readonly runId: string;
      readonly image: string;
      readonly networkAccess: boolean;
      /** The workspace's secrets, by the name the workspace sees them under. */
      readonly env: Readonly<Record<string, string>>;
      /** For each of env's names, the control-plane variable its value came from (see fleet-relay.ts). */
      readonly envSources?: Readonly<Record<string, string>>;
    }
  | { readonly kind: "release"; readonly workspaceId: string }
  | {
      readonly kind: "exec";
      readonly workspaceId: string;
      readonly argv: readonly string[];
      readonly workingDirectory: string;
      readonly env: Readonly<Record<string, string>>;
      readonly timeoutMs: number;
      readonly maxOutputBytes: number;
    }
  | { readonly kind: "read_file"; readonly workspaceId: string; readonly path: string; readonly maxBytes: number }
  | { readonly kind: "write_file"; readonly workspaceId: string; readonly path: string; readonly content: Uint8Array }
  | { readonly kind: "list_files"; readonly workspaceId: string; readonly path: string }
  | { readonly kind: "reattach"; readonly workspaceId: string };

export interface HostCommand {
  readonly commandId: string;
  readonly action: HostAction;
  /** The sending worker's run-lease epoch, for the host's fence (execs and writes). */
  readonly leaseEpoch?: number;
}

export type OutputStreamName = "stdout" | "stderr";

export interface CommandOutcome {
  readonly commandId: string;
  readonly ok: boolean;
  readonly exitCode: number;
  readonly durationMs: number;
  readonly timedOut: boolean;
  readonly outputTruncated: boolean;
  readonly error: string;
  readonly errorReason: string;
  readonly data: Uint8Array;
  readonly outputTail: Uint8Array;
  /** All output the command produced (up to the cap): more than the tail means the tail was cut. */
  readonly outputBytes: number;
  readonly unknownCommand: boolean;
}

export type HostMessage =
  | { readonly kind: "heartbeat"; readonly freeWorkspaces: number }
  | { readonly kind: "output"; readonly commandId: string; readonly stream: OutputStreamName; readonly chunk: Uint8Array }
  | { readonly kind: "result"; readonly outcome: CommandOutcome };
