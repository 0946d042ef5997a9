// The pino mixin that puts the active span's ids on a log line, so a line found in the logs
// leads to its trace and back. Field names are those of OpenTelemetry's pino instrumentation,
// which log pipelines already map to a trace link.
import { isSpanContextValid, trace, TraceFlags } from "@opentelemetry/api";

export interface TraceIds {
  readonly trace_id: string;
  readonly span_id: string;
  readonly trace_flags: string;
}

/**
 * The ids of the span active where a line is logged, or nothing. Without a registered context
 * manager (tracing off) the active context is always the empty root one: a cheap lookup. The
 * object is fresh every time because pino merges the line's fields into it.
 */
export function traceIdsOfActiveSpan(): TraceIds | Record<string, never> {
  const span = trace.getActiveSpan();
  if (span === undefined) return {};
  const ids = span.spanContext();
  if (!isSpanContextValid(ids)) return {};
  return { trace_id: ids.traceId, span_id: ids.spanId, trace_flags: (ids.traceFlags & TraceFlags.SAMPLED) !== 0 ? "01" : "00" };
}
