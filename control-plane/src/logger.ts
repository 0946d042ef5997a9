// The control plane's logger: pino with secrets kept out of every line it writes.
import { pino, type DestinationStream, type Logger } from "pino";
import { secretEnvAllowed } from "./domain/agent.js";
import { createLogLineRedactor } from "./domain/redaction.js";
import { traceIdsOfActiveSpan } from "./telemetry/log-trace-ids.js";

/** Fields that carry credentials wherever they appear in a logged object (one level deep). */
const CREDENTIAL_PATHS = ["authorization", "cookie", "token", "secret", "password", "apiKey", "api_key"].flatMap((key) => [
  key,
  `*.${key}`,
  `*.headers.${key}`,
  `req.headers.${key}`,
]);

/**
 * Values of the control plane's secret variables (those a spec may grant or use as an API key):
 * no log line may contain them, whichever field or message they end up in.
 */
export function secretValuesOf(env: Readonly<Record<string, string | undefined>>, prefixes: readonly string[]): string[] {
  return Object.entries(env)
    .filter(([name, value]) => value !== undefined && value !== "" && secretEnvAllowed(name, prefixes))
    .map(([, value]) => value!);
}

export interface KeelLoggerOptions {
  readonly level: string;
  readonly secretValues: readonly string[];
  /** Where lines go (default: stdout); tests capture them. */
  readonly destination?: DestinationStream;
}

/**
 * Credentials by field name are censored by pino's redact paths; secret values anywhere else
 * (a message, an error, a command line) are replaced in the serialized line before it is written.
 */
export function createKeelLogger(options: KeelLoggerOptions): Logger {
  const scrub = createLogLineRedactor(options.secretValues);
  return pino(
    {
      level: options.level,
      base: { service: "keel" },
      redact: { paths: CREDENTIAL_PATHS, censor: "[redacted]" },
      hooks: { streamWrite: scrub },
      // A line written inside a span (a run's claim, step, model or tool call) names its trace.
      mixin: traceIdsOfActiveSpan,
    },
    options.destination ?? pino.destination(1),
  );
}
