// How enum values, times, money and sizes read on screen.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";
import {
  ModelRole,
  ResolvedOutcome,
  RunEventKind,
  RunStatus,
  ToolEffect,
  ToolInvocationStatus,
  WaitReason,
} from "../../gen/keel/v1/run_pb.js";

/** An enum value's name without its prefix, lowercase: RUN_STATUS_AWAITING_TOOL → awaiting_tool. */
const label =
  (names: Record<number, string>) =>
  (value: number): string =>
    (names[value] ?? String(value)).toLowerCase();

export const statusLabel = label(RunStatus);
export const waitReasonLabel = (value: WaitReason) => (value === WaitReason.UNSPECIFIED ? "" : label(WaitReason)(value));
export const roleLabel = label(ModelRole);
export const effectLabel = label(ToolEffect);
export const toolStatusLabel = label(ToolInvocationStatus);
export const outcomeLabel = label(ResolvedOutcome);
export const eventKindLabel = label(RunEventKind);

const TERMINAL = new Set([RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED]);
export const isTerminal = (status: RunStatus) => TERMINAL.has(status);

/** The statuses the runs filter offers, in lifecycle order. */
export const FILTER_STATUSES: readonly RunStatus[] = [
  RunStatus.QUEUED,
  RunStatus.RUNNING,
  RunStatus.AWAITING_TOOL,
  RunStatus.AWAITING_INPUT,
  RunStatus.WAITING,
  RunStatus.SUCCEEDED,
  RunStatus.FAILED,
  RunStatus.CANCELLED,
  RunStatus.BUDGET_EXHAUSTED,
];

export function dateOf(timestamp: Timestamp | undefined): Date | undefined {
  return timestamp === undefined ? undefined : timestampDate(timestamp);
}

/** A compact age: 42s, 5m, 3h, 2d. */
export function age(since: Date | undefined, now: number): string {
  if (since === undefined) return "";
  const s = Math.max(0, Math.round((now - since.getTime()) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86_400)}d`;
}

export const ms = (value: number | bigint) => {
  const n = Number(value);
  return n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(n < 10_000 ? 2 : 1)} s`;
};

export const usd = (microUsd: bigint | number) => `$${(Number(microUsd) / 1_000_000).toFixed(4)}`;

export const count = (value: bigint | number) => Number(value).toLocaleString("en-US");

/** JSON pretty-printed when it parses, else as given. */
export function prettyJson(text: string): string {
  if (text === "") return "";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

export function errorText(error: unknown): string {
  if (error instanceof ConnectError) return error.rawMessage === "" ? error.message : `${error.rawMessage} (${codeName(error.code)})`;
  return error instanceof Error ? error.message : String(error);
}

function codeName(code: number): string {
  const names = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss", "unauthenticated"];
  return names[code] ?? String(code);
}
