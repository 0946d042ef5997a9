// Request checks shared by the service files; each error names the proto field.
import type { Actor } from "../../../gen/keel/v1/run_pb.js";
import { GateDecision as GateDecisionEnum } from "../../../gen/keel/v1/work_graph_pb.js";
import { InvalidArgumentError } from "../domain/errors.js";
import { requireExternalId } from "../domain/ids.js";
import type { GateDecision } from "../domain/work-graph-schedule.js";

export const MAX_PAGE_SIZE = 500;
export const DEFAULT_PAGE_SIZE = 50;

export function requireActor(field: string, actor: Pick<Actor, "id" | "displayName"> | undefined): { id: string; displayName: string } {
  if (actor === undefined) throw new InvalidArgumentError(field, "is required");
  const id = requireExternalId(`${field}.id`, actor.id);
  if (actor.displayName.length > 256) throw new InvalidArgumentError(`${field}.display_name`, "must be at most 256 characters");
  return { id, displayName: actor.displayName };
}

export function pageSizeOf(requested: number): number {
  if (requested === 0) return DEFAULT_PAGE_SIZE;
  return Math.min(requested, MAX_PAGE_SIZE);
}

export function requireEnum(field: string, value: number): number {
  if (value === 0) throw new InvalidArgumentError(field, "must be set");
  return value;
}

export function requireGateDecision(field: string, value: GateDecisionEnum): GateDecision {
  if (value === GateDecisionEnum.APPROVE) return "approve";
  if (value === GateDecisionEnum.REJECT) return "reject";
  if (value === GateDecisionEnum.UNSPECIFIED) throw new InvalidArgumentError(field, "must be set");
  throw new InvalidArgumentError(field, `${String(value)} is not a GateDecision`);
}

export function requireReason(field: string, reason: string): string {
  if (reason.length > 4096) throw new InvalidArgumentError(field, "must be at most 4096 characters");
  return reason;
}

/**
 * A uint64 stream cursor as a JS number, at most `max`: the column's range (an int sequence
 * stops at 2^31-1), else 2^53-1. A larger value would lose precision or overflow in the query.
 */
export function cursorOf(field: string, value: bigint, max = Number.MAX_SAFE_INTEGER): number {
  if (value > BigInt(max)) throw new InvalidArgumentError(field, `must be at most ${max}`);
  return Number(value);
}
