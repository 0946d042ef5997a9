// The control plane's id checks: the shapes live in common/ids.ts (the sandbox agent shares
// them); here a bad value becomes the typed error the API maps to InvalidArgument.
import { byteLength, externalIdProblem, slugProblem, uuidProblem } from "../../../common/ids.js";
import { InvalidArgumentError, ResourceExhaustedError } from "./errors.js";

export { byteLength };

export function requireUuid(field: string, value: string): string {
  const problem = uuidProblem(value);
  if (problem !== undefined) throw new InvalidArgumentError(field, problem);
  return value.toLowerCase();
}

export function requireSlug(field: string, value: string): string {
  const problem = slugProblem(value);
  if (problem !== undefined) throw new InvalidArgumentError(field, problem);
  return value;
}

export function requireExternalId(field: string, value: string): string {
  const problem = externalIdProblem(value);
  if (problem !== undefined) throw new InvalidArgumentError(field, problem);
  return value;
}

export function optionalExternalId(field: string, value: string): string | undefined {
  return value === "" ? undefined : requireExternalId(field, value);
}

export function requireText(field: string, value: string, maxBytes: number): string {
  if (value.trim() === "") throw new InvalidArgumentError(field, "must not be empty");
  if (byteLength(value) > maxBytes) throw new ResourceExhaustedError(`${field}: must be at most ${maxBytes} bytes`);
  return value;
}
