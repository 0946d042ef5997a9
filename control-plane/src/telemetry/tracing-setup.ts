// Tracing as the environment configures it. OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-only
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns on OTLP over HTTP; a test hands in its own exporter;
// otherwise nothing is set up and the runner gets no tracing port at all, so the loop pays nothing.
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, SimpleSpanProcessor, TracerProvider, type SpanExporter } from "@opentelemetry/sdk-trace";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";
import { ConfigError } from "../config.js";
import type { RunTracing } from "../runner/run-telemetry.js";
import { createRunTracing } from "./run-spans.js";

export interface Tracing {
  readonly run: RunTracing;
  /** Exports what is still buffered, then stops; the process-wide registrations made here are undone. */
  shutdown(): Promise<void>;
}

const OTLP_TRACES_PATH = "v1/traces";

/**
 * Where OTLP traces go: the traces endpoint as given, or the general endpoint with the signal's
 * path appended (as the OTLP exporter specification says); undefined when neither is set.
 */
export function otlpTracesUrl(env: Readonly<Record<string, string | undefined>>): string | undefined {
  const own = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]?.trim() ?? "";
  const base = env["OTEL_EXPORTER_OTLP_ENDPOINT"]?.trim() ?? "";
  const [name, value] = own !== "" ? ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", own] : ["OTEL_EXPORTER_OTLP_ENDPOINT", base];
  if (value === "") return undefined;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new ConfigError(`invalid setting ${name}: ${JSON.stringify(value)} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new ConfigError(`invalid setting ${name}: must be an http or https URL`);
  if (own !== "") return url.toString();
  return `${url.toString().replace(/\/+$/, "")}/${OTLP_TRACES_PATH}`;
}

export interface TracingOptions {
  /** Spans go here, each as it ends, instead of OTLP (tests: an InMemorySpanExporter). */
  readonly exporter?: SpanExporter;
  readonly serviceVersion?: string;
}

/** Starts tracing if configured; undefined means tracing is off. */
export function startTracing(env: Readonly<Record<string, string | undefined>>, options: TracingOptions = {}): Tracing | undefined {
  if (env["OTEL_SDK_DISABLED"]?.trim().toLowerCase() === "true") return undefined;
  const url = options.exporter === undefined ? otlpTracesUrl(env) : undefined;
  if (options.exporter === undefined && url === undefined) return undefined;
  // A given exporter sees each span as it ends; OTLP batches, off the loop's path.
  const processor =
    options.exporter !== undefined ? new SimpleSpanProcessor({ exporter: options.exporter }) : new BatchSpanProcessor({ exporter: new OTLPTraceExporter({ url: url! }) });
  const provider = new TracerProvider({
    resource: resourceFromAttributes({
      [ATTR_SERVICE_NAME]: env["OTEL_SERVICE_NAME"]?.trim() || "keel",
      ...(options.serviceVersion === undefined ? {} : { [ATTR_SERVICE_VERSION]: options.serviceVersion }),
    }),
    spanProcessors: [processor],
  });
  // Spans nest across awaits through AsyncLocalStorage. If the process already has a context
  // manager or tracer provider (another instrumentation), that one stays; our spans use our
  // provider's tracer directly and nest through whichever manager is active.
  const contextManager = new AsyncLocalStorageContextManager().enable();
  const ownsContext = context.setGlobalContextManager(contextManager);
  if (!ownsContext) contextManager.disable();
  const ownsProvider = trace.setGlobalTracerProvider(provider);
  return {
    run: createRunTracing(provider.getTracer("keel", options.serviceVersion)),
    async shutdown() {
      await provider.shutdown();
      if (ownsProvider) trace.disable();
      if (ownsContext) context.disable();
    },
  };
}
