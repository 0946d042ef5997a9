// Typed domain errors. api/error-mapping.ts is the one place that turns them into codes.

export abstract class DomainError extends Error {
  abstract readonly code:
    | "invalid_argument"
    | "not_found"
    | "already_exists"
    | "failed_precondition"
    | "permission_denied"
    | "unauthenticated"
    | "resource_exhausted"
    | "unimplemented"
    | "unavailable"
    | "aborted";
}

export class InvalidArgumentError extends DomainError {
  readonly code = "invalid_argument";
  constructor(
    readonly field: string,
    reason: string,
  ) {
    super(`${field}: ${reason}`);
  }
}

export class NotFoundError extends DomainError {
  readonly code = "not_found";
  constructor(what: string, id: string) {
    super(`${what} ${JSON.stringify(id)} not found`);
  }
}

export class FailedPreconditionError extends DomainError {
  readonly code = "failed_precondition";
}

export class PermissionDeniedError extends DomainError {
  readonly code = "permission_denied";
}

export class UnauthenticatedError extends DomainError {
  readonly code = "unauthenticated";
}

export class ResourceExhaustedError extends DomainError {
  readonly code = "resource_exhausted";
}

export class UnimplementedError extends DomainError {
  readonly code = "unimplemented";
}

export class UnavailableError extends DomainError {
  readonly code = "unavailable";
}

/** A worker lost its lease: another worker holds a newer epoch. Its writes are refused. */
export class LeaseLostError extends DomainError {
  readonly code = "aborted";
  constructor(runId: string, epoch: number) {
    super(`lease on run ${runId} at epoch ${epoch} was taken by another worker`);
  }
}

/** A model provider failed: HTTP error, timeout, or output that does not parse. */
export class ModelProviderError extends DomainError {
  readonly code = "unavailable";
}
