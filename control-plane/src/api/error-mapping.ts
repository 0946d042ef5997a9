import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { DomainError } from "../domain/errors.js";
import { isDatabaseUnavailable } from "../ledger/database-errors.js";

const CODES: Record<DomainError["code"], Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  failed_precondition: Code.FailedPrecondition,
  permission_denied: Code.PermissionDenied,
  unauthenticated: Code.Unauthenticated,
  resource_exhausted: Code.ResourceExhausted,
  unimplemented: Code.Unimplemented,
  unavailable: Code.Unavailable,
  aborted: Code.Aborted,
};

/**
 * The one place errors become codes. Domain errors keep their message; a ConnectError
 * raised by the framework (size limits, deadlines) passes through; a database that cannot be
 * reached is Unavailable, which clients retry; anything else is a bug, logged with its cause
 * and answered as Internal without detail.
 */
export function toConnectError(error: unknown, log: Logger, procedure: string): ConnectError {
  if (error instanceof DomainError) return new ConnectError(error.message, CODES[error.code]);
  if (error instanceof ConnectError) return undecodableRequest(error) ?? error;
  if (isDatabaseUnavailable(error)) {
    log.warn({ err: error, procedure }, "the ledger database is unavailable");
    return new ConnectError("the ledger database is unavailable right now; retry shortly", Code.Unavailable);
  }
  const id = Math.random().toString(36).slice(2, 10);
  log.error({ err: error, procedure, errorId: id }, "internal error");
  return new ConnectError(`internal error (reference ${id})`, Code.Internal);
}

/**
 * connect-es reports request bytes it cannot decode (truncated, a bad varint or tag) as Internal.
 * They are the caller's bad input; where the failure reaches us (streamed requests) it says so.
 */
function undecodableRequest(error: ConnectError): ConnectError | undefined {
  if (error.code !== Code.Internal || !error.rawMessage.startsWith("parse binary: ")) return undefined;
  return new ConnectError(`request: not a valid protobuf message (${error.rawMessage.slice("parse binary: ".length)})`, Code.InvalidArgument);
}

/**
 * The same messages, an error from the stream mapped on its way out. A plain iterator, not an async
 * generator: it sits on every message of every stream, and a generator's `yield*` costs several
 * promise turns per message (about a tenth of a Subscribe delivery's CPU).
 */
function mapErrors<T>(messages: AsyncIterable<T>, map: (error: unknown) => Error): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const inner = messages[Symbol.asyncIterator]();
      const rethrow = (error: unknown): never => {
        throw map(error);
      };
      return {
        next: () => inner.next().catch(rethrow),
        return: (value?: unknown) => (inner.return === undefined ? Promise.resolve({ done: true, value } as IteratorResult<T>) : inner.return(value).catch(rethrow)),
      };
    },
  };
}

export function errorMappingInterceptor(log: Logger): Interceptor {
  return (next) => async (request) => {
    const procedure = request.method.parent.typeName + "/" + request.method.name;
    try {
      const response = await next(request);
      if (!response.stream) return response;
      // A client that hung up ends its stream: that is not a server error.
      const mapped = (error: unknown): ConnectError =>
        request.signal.aborted ? new ConnectError("the client ended the stream", Code.Canceled) : toConnectError(error, log, procedure);
      return { ...response, message: mapErrors(response.message, mapped) };
    } catch (error) {
      throw toConnectError(error, log, procedure);
    }
  };
}
