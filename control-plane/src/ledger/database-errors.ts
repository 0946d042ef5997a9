// Which errors mean "the ledger's database cannot be reached right now" (restarting, refusing
// connections, gone mid-query): a caller may retry those, unlike a bug or a bad request.

/** SQLSTATEs of a database that is down, starting, shutting down or out of connections. */
const UNAVAILABLE_STATES = new Set(["57P01", "57P02", "57P03", "53300"]);
/** Socket errors of a connection that could not be made or was cut. */
const SOCKET_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENOENT"]);
/** What pg and pg-pool say when a connection dies or cannot be had in time. */
const DRIVER_MESSAGES = [/^Connection terminated/, /^timeout exceeded when trying to connect/, /^Client has encountered a connection error/, /^Cannot use a pool after calling end/];

export function isDatabaseUnavailable(error: unknown): boolean {
  if (error instanceof AggregateError) return error.errors.some(isDatabaseUnavailable);
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string") {
    // Class 08 is "connection exception".
    if (code.startsWith("08") || UNAVAILABLE_STATES.has(code)) return true;
    if (SOCKET_CODES.has(code) && (error as { syscall?: unknown }).syscall !== undefined) return true;
  }
  return DRIVER_MESSAGES.some((pattern) => pattern.test(error.message));
}
