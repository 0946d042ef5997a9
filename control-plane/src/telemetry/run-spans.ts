// The runner's tracing port over an OpenTelemetry tracer: a span per claim of a run, per step,
// per model call and per tool call. Model and tool spans follow the GenAI semantic conventions'
// names (`chat <model>`, `execute_tool <tool>`, gen_ai.* attributes) so trace UIs that know
// them group them; Keel's own identities go under keel.*.
import { SpanKind, SpanStatusCode, type Attributes, type Span, type Tracer } from "@opentelemetry/api";
import type { RunTracing } from "../runner/run-telemetry.js";

/** Attribute names shared with the tests and the docs. */
export const SPAN_ATTRIBUTES = {
  runId: "keel.run.id",
  agentId: "keel.agent.id",
  workerId: "keel.worker.id",
  leaseEpoch: "keel.lease.epoch",
  connector: "keel.connector",
  stepIndex: "keel.step.index",
  stepNext: "keel.step.next",
  operation: "gen_ai.operation.name",
  provider: "gen_ai.provider.name",
  model: "gen_ai.request.model",
  inputTokens: "gen_ai.usage.input_tokens",
  outputTokens: "gen_ai.usage.output_tokens",
  finishReasons: "gen_ai.response.finish_reasons",
  toolName: "gen_ai.tool.name",
  toolCallId: "gen_ai.tool.call.id",
  toolEffect: "keel.tool.effect",
  toolOk: "keel.tool.ok",
  exitCode: "keel.tool.exit_code",
} as const;

export const SPAN_NAMES = { run: "keel.run", step: "keel.step", modelCall: "chat", toolCall: "execute_tool" } as const;

/**
 * Runs `work` inside an active span that ends when it settles; a throw marks the span as an
 * error (the cause's message, not its stack: traces leave the machine, logs hold the rest).
 */
function inSpan<T>(tracer: Tracer, name: string, kind: SpanKind, attributes: Attributes, work: () => Promise<T>, describe?: (span: Span, result: T) => void): Promise<T> {
  return tracer.startActiveSpan(name, { kind, attributes }, async (span) => {
    try {
      const result = await work();
      describe?.(span, result);
      return result;
    } catch (error) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
      throw error;
    } finally {
      span.end();
    }
  });
}

export function createRunTracing(tracer: Tracer): RunTracing {
  const A = SPAN_ATTRIBUTES;
  return {
    claim(claimed, workerId, work) {
      const attributes = {
        [A.runId]: claimed.runId,
        [A.agentId]: claimed.agent.id,
        [A.workerId]: workerId,
        [A.leaseEpoch]: claimed.epoch,
        [A.connector]: claimed.connector,
      };
      return inSpan(tracer, SPAN_NAMES.run, SpanKind.INTERNAL, attributes, work);
    },
    step(runId, stepIndex, work) {
      return inSpan(tracer, SPAN_NAMES.step, SpanKind.INTERNAL, { [A.runId]: runId, [A.stepIndex]: stepIndex }, work, (span, next) =>
        span.setAttribute(A.stepNext, next.kind),
      );
    },
    modelCall(runId, spec, work) {
      const model = spec.model === "" ? spec.provider : spec.model;
      const attributes = { [A.runId]: runId, [A.operation]: "chat", [A.provider]: spec.provider, [A.model]: model };
      return inSpan(tracer, `${SPAN_NAMES.modelCall} ${model}`, SpanKind.CLIENT, attributes, work, (span, turn) =>
        span.setAttributes({ [A.inputTokens]: turn.usage.inputTokens, [A.outputTokens]: turn.usage.outputTokens, [A.finishReasons]: [turn.finishReason] }),
      );
    },
    toolCall(runId, intent, work) {
      const attributes = { [A.runId]: runId, [A.operation]: "execute_tool", [A.toolName]: intent.toolName, [A.toolCallId]: intent.id, [A.toolEffect]: intent.effect };
      return inSpan(tracer, `${SPAN_NAMES.toolCall} ${intent.toolName}`, SpanKind.INTERNAL, attributes, work, (span, result) => {
        span.setAttribute(A.toolOk, result.ok);
        if (result.exitCode !== undefined) span.setAttribute(A.exitCode, result.exitCode);
        if (!result.ok) span.setStatus({ code: SpanStatusCode.ERROR, message: "the tool reported a failure" });
      });
    },
  };
}
