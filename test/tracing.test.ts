// Traces and latency metrics of a real run (issue #15, build item 4): Keel built as `keel serve`
// builds it, with an in-memory span exporter handed to the same composition path, a scripted run
// with a tool call, and the JSON log lines Keel's own logger writes. Then the OTLP path: the
// same run with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a local HTTP receiver.
import { randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace";
import type { Logger } from "pino";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { buildApp, type KeelApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { scriptedAgent, scriptedTurn as turn, toolCall as call, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createKeelLogger } from "../control-plane/src/logger.js";
import { SPAN_ATTRIBUTES as A, SPAN_NAMES } from "../control-plane/src/telemetry/run-spans.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { connectClient } from "./support/clients.js";
import { createTestDatabase } from "./support/keel-fixture.js";
import { waitFor } from "./support/sandbox-support.js";

const TOOL = "test.logged.v1";
const AGENT = scriptedAgent("traced", [turn("", [call(TOOL, { text: "hello" })], { inputTokens: 30, outputTokens: 7 }), turn("done: {{message}}")], {
  tools: toolGrants([TOOL]),
});

/** A read that writes one log line through Keel's logger while it runs (inside its span). */
function loggedTool(log: () => Logger) {
  return defineTool<{ text: string }>({
    name: "test.logged",
    version: 1,
    description: "Logs a line and echoes its text.",
    parameters: z.object({ text: z.string() }),
    effect: "read",
    execute(args) {
      log().info({ probe: args.text }, "the tool ran");
      return Promise.resolve({ ok: true, text: `logged ${args.text}` });
    },
  });
}

interface TracedKeel {
  readonly app: KeelApp;
  readonly url: string;
  readonly http1Url: string;
  readonly operator: string;
  readonly connector: string;
}

async function startKeel(env: Record<string, string>, log: Logger, exporter?: InMemorySpanExporter): Promise<TracedKeel> {
  const all = { DATABASE_URL: await createTestDatabase(), KEEL_WORKERS: "2", KEEL_IDLE_POLL_MS: "500", KEEL_LEASE_MS: "3000", KEEL_DB_POOL_MAX: "10", ...env };
  const app = await buildApp(loadConfig(all), all, { log, tools: [loggedTool(() => log)], ...(exporter === undefined ? {} : { spanExporter: exporter }) });
  try {
    await app.agents.put(AGENT);
    const operator = (await app.tokens.create("operator", "test", { scope: { kind: "role" } })).secret;
    const connector = (await app.tokens.create("connector", "test", { scope: { kind: "connector", connectors: "any", agents: "any" } })).secret;
    const { url, http1Url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
    app.startWorkers();
    return { app, url, http1Url, operator, connector };
  } catch (error) {
    await app.stop();
    throw error;
  }
}

/** Submits a message to the traced agent and waits for its run to succeed. */
async function runToCompletion(keel: TracedKeel): Promise<string> {
  const tag = randomBytes(4).toString("hex");
  const ingress = connectClient(IngressService, keel.url, keel.connector);
  const { runId } = await ingress.submitMessage({ agentId: AGENT.id, conversationId: `c-${tag}`, actor: { id: "tess" }, messageId: `m-${tag}`, text: "trace me", connector: "trace-test" });
  const runs = connectClient(RunService, keel.url, keel.operator);
  const run = await waitFor(
    `run ${runId} to settle`,
    async () => {
      const { run } = await runs.getRun({ runId });
      return run !== undefined && run.status !== RunStatus.QUEUED && run.status !== RunStatus.RUNNING && run.status !== RunStatus.AWAITING_TOOL ? run : undefined;
    },
    45_000,
    50,
  );
  expect(RunStatus[run.status]).toBe("SUCCEEDED");
  return runId;
}

const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;
const idOf = (span: ReadableSpan) => span.spanContext().spanId;

describe("tracing", () => {
  it("records the span tree run > step > model call / tool call, with ids in the log lines and latency histograms", async () => {
    const exporter = new InMemorySpanExporter();
    const lines: string[] = [];
    const log = createKeelLogger({ level: "debug", secretValues: [], destination: { write: (line: string) => void lines.push(line) } });
    const keel = await startKeel({}, log, exporter);
    try {
      const runId = await runToCompletion(keel);
      // The claim's span ends once its worker lets go, a moment after the reply commits.
      const runSpan = await waitFor("the run's span", () =>
        exporter.getFinishedSpans().find((span) => span.name === SPAN_NAMES.run && span.attributes[A.runId] === runId),
      );
      const spans = exporter.getFinishedSpans().filter((span) => span.attributes[A.runId] === runId);
      const traceId = runSpan.spanContext().traceId;
      expect(runSpan.attributes).toMatchObject({ [A.runId]: runId, [A.agentId]: "traced", [A.connector]: "trace-test" });
      expect(parentOf(runSpan)).toBeUndefined();
      expect(spans.every((span) => span.spanContext().traceId === traceId)).toBe(true);

      const steps = spans.filter((span) => span.name === SPAN_NAMES.step).sort((a, b) => Number(a.attributes[A.stepIndex]) - Number(b.attributes[A.stepIndex]));
      expect(steps.map((step) => [step.attributes[A.stepIndex], step.attributes[A.stepNext]])).toEqual([
        [0, "continue"],
        [1, "park"],
      ]);
      for (const step of steps) expect(parentOf(step)).toBe(idOf(runSpan));

      const models = spans.filter((span) => span.attributes[A.operation] === "chat");
      expect(models.map(parentOf)).toEqual(expect.arrayContaining(steps.map(idOf)));
      expect(models).toHaveLength(2);
      const firstModel = models.find((span) => parentOf(span) === idOf(steps[0]!))!;
      expect(firstModel.name).toBe(`chat ${AGENT.models.primary.model}`);
      expect(firstModel.attributes).toMatchObject({ [A.provider]: "scripted", [A.inputTokens]: 30, [A.outputTokens]: 7 });

      const tools = spans.filter((span) => span.attributes[A.operation] === "execute_tool");
      expect(tools).toHaveLength(1);
      const tool = tools[0]!;
      expect(tool.name).toBe(`execute_tool ${TOOL}`);
      expect(parentOf(tool)).toBe(idOf(steps[0]!));
      expect(tool.attributes).toMatchObject({ [A.toolName]: TOOL, [A.toolEffect]: "read", [A.toolOk]: true });

      // Log lines written inside a span carry its ids: the tool's line names the tool's span,
      // the driver's the run's; a line written outside any span names none.
      const entries = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
      const toolLine = entries.find((entry) => entry["msg"] === "the tool ran");
      expect(toolLine).toMatchObject({ trace_id: traceId, span_id: idOf(tool), trace_flags: "01" });
      const driverLine = entries.find((entry) => entry["msg"] === "driving the run" && entry["runId"] === runId);
      expect(driverLine).toMatchObject({ trace_id: traceId, span_id: idOf(runSpan) });
      log.info("outside every span");
      const outside = lines.map((line) => JSON.parse(line) as Record<string, unknown>).find((entry) => entry["msg"] === "outside every span");
      expect(outside).toBeDefined();
      expect(outside).not.toHaveProperty("trace_id");

      const metrics = await (await fetch(`${keel.http1Url}/metrics`, { headers: { authorization: `Bearer ${keel.operator}` } })).text();
      const value = (sample: string) => Number(new RegExp(`^${sample.replace(/[{}.+"]/g, "\\$&")} (\\S+)$`, "m").exec(metrics)?.[1]);
      expect(metrics).toContain("# TYPE keel_step_duration_seconds histogram");
      expect(value("keel_step_duration_seconds_count")).toBeGreaterThanOrEqual(2);
      expect(value('keel_step_duration_seconds_bucket{le="+Inf"}')).toBe(value("keel_step_duration_seconds_count"));
      expect(value("keel_step_duration_seconds_sum")).toBeGreaterThan(0);
      expect(value('keel_model_call_duration_seconds_count{provider="scripted"}')).toBeGreaterThanOrEqual(2);
      expect(value(`keel_tool_call_duration_seconds_count{tool="${TOOL}"}`)).toBe(1);
      expect(value(`keel_tool_call_duration_seconds_bucket{tool="${TOOL}",le="+Inf"}`)).toBe(1);
      // The ledger's gauges are still there beside them.
      expect(metrics).toContain('keel_runs{status="succeeded"} 1');
    } finally {
      await keel.app.stop();
    }
  });

  it("exports over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT, flushing on stop", async () => {
    const bodies: unknown[] = [];
    const receiver: Server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on("data", (chunk: Buffer) => chunks.push(chunk));
      request.on("end", () => {
        if (request.url === "/v1/traces" && String(request.headers["content-type"]).startsWith("application/json")) {
          bodies.push(JSON.parse(Buffer.concat(chunks).toString("utf8")));
        }
        response.writeHead(200, { "content-type": "application/json" });
        response.end("{}");
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
    try {
      const endpoint = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
      const keel = await startKeel({ OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_SERVICE_NAME: "keel-under-test" }, pino({ level: "silent" }));
      let runId: string;
      try {
        runId = await runToCompletion(keel);
      } finally {
        await keel.app.stop();
      }
      type OtlpValue = { stringValue?: string; intValue?: string | number };
      type OtlpBody = {
        resourceSpans: { resource: { attributes: { key: string; value: OtlpValue }[] }; scopeSpans: { spans: { name: string; attributes: { key: string; value: OtlpValue }[] }[] }[] }[];
      };
      const resources = (bodies as OtlpBody[]).flatMap((body) => body.resourceSpans);
      expect(resources.length).toBeGreaterThan(0);
      expect(resources[0]!.resource.attributes).toContainEqual({ key: "service.name", value: { stringValue: "keel-under-test" } });
      const ofRun = resources
        .flatMap((resource) => resource.scopeSpans.flatMap((scope) => scope.spans))
        .filter((span) => span.attributes.some((a) => a.key === A.runId && a.value.stringValue === runId));
      expect(new Set(ofRun.map((span) => span.name))).toEqual(new Set([SPAN_NAMES.run, SPAN_NAMES.step, `chat ${AGENT.models.primary.model}`, `execute_tool ${TOOL}`]));
    } finally {
      await new Promise<void>((resolve) => receiver.close(() => resolve()));
    }
  });
});
