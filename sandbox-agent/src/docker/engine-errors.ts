// Reading the Docker engine's errors, and wrapping them as the port's WorkspaceError.
import { WorkspaceError } from "../workspace-backend.js";

export function statusCode(error: unknown): number | undefined {
  return typeof error === "object" && error !== null && "statusCode" in error && typeof error.statusCode === "number" ? error.statusCode : undefined;
}

export function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export function failure(what: string, error: unknown): WorkspaceError {
  if (error instanceof WorkspaceError) return error;
  const wrapped = new WorkspaceError("backend_failure", `${what}: ${message(error)}`);
  wrapped.cause = error;
  return wrapped;
}
