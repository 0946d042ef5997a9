import { describe, expect, it } from "vitest";
import { createLatencyHistograms, LATENCY_BUCKETS_S } from "./latency-histograms.js";
import { traceIdsOfActiveSpan } from "./log-trace-ids.js";
import { otlpTracesUrl, startTracing } from "./tracing-setup.js";

/** The sample lines of a rendering, as name{labels} → value. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

describe("latency histograms", () => {
  it("render cumulative buckets, sum and count per label in Prometheus text", () => {
    const histograms = createLatencyHistograms();
    histograms.record("model_call", 3, "scripted"); // 0.003 s
    histograms.record("model_call", 700, "scripted"); // 0.7 s
    histograms.record("model_call", 400_000, "scripted"); // past the last bound
    histograms.record("tool_call", 20, 'odd"name\\');
    const text = histograms.render();
    const values = samples(text);
    expect(text).toContain("# TYPE keel_model_call_duration_seconds histogram");
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="0.001"}')).toBe(0);
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="0.005"}')).toBe(1);
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="0.5"}')).toBe(1);
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="1.0"}')).toBe(2);
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="300.0"}')).toBe(2);
    expect(values.get('keel_model_call_duration_seconds_bucket{provider="scripted",le="+Inf"}')).toBe(3);
    expect(values.get('keel_model_call_duration_seconds_count{provider="scripted"}')).toBe(3);
    expect(values.get('keel_model_call_duration_seconds_sum{provider="scripted"}')).toBeCloseTo(400.703, 6);
    // A label value is escaped, never allowed to break the line format.
    expect(values.get('keel_tool_call_duration_seconds_count{tool="odd\\"name\\\\"}')).toBe(1);
    // Steps have no label and are reported before the first one.
    expect(values.get("keel_step_duration_seconds_count")).toBe(0);
    expect(values.get('keel_step_duration_seconds_bucket{le="+Inf"}')).toBe(0);
    expect([...values.keys()].filter((key) => key.startsWith("keel_step_duration_seconds_bucket"))).toHaveLength(LATENCY_BUCKETS_S.length + 1);
  });
});

describe("tracing configuration", () => {
  it("is off without an endpoint, and then log lines carry no ids", () => {
    expect(startTracing({})).toBeUndefined();
    expect(startTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318", OTEL_SDK_DISABLED: "true" })).toBeUndefined();
    expect(traceIdsOfActiveSpan()).toEqual({});
  });

  it("appends the traces path to the general endpoint and takes the traces endpoint as given", () => {
    expect(otlpTracesUrl({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" })).toBe("http://collector:4318/v1/traces");
    expect(otlpTracesUrl({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/base/" })).toBe("http://collector:4318/base/v1/traces");
    expect(otlpTracesUrl({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://a:1", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "https://b:2/x" })).toBe("https://b:2/x");
    expect(() => otlpTracesUrl({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318 " })).toThrow(/OTEL_EXPORTER_OTLP_ENDPOINT/);
    expect(() => otlpTracesUrl({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "not a url" })).toThrow(/invalid setting OTEL_EXPORTER_OTLP_TRACES_ENDPOINT/);
  });
});
