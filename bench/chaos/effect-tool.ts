// The chaos workload's external write: an HTTP call to the effect log, keyed by the tool
// invocation's id. That id is Keel's idempotency key today: the invocation row (the intent) is
// committed before the call goes out, and the tool's lookup asks the service for the key when
// a crash leaves the outcome unknown, so recovery settles it without an operator.
import { z } from "zod";
import { defineTool, type LookupOutcome, type ToolDefinition } from "../../control-plane/src/tools/tool-registry.js";

export const EFFECT_TOOL = "chaos.post_effect";
const REQUEST_TIMEOUT_MS = 10_000;

const withTimeout = (signal: AbortSignal) => AbortSignal.any([signal, AbortSignal.timeout(REQUEST_TIMEOUT_MS)]);

export function createEffectTool(effectLogUrl: string): ToolDefinition {
  return defineTool<{ note: string }>({
    name: EFFECT_TOOL,
    version: 1,
    description: "Records an effect in the external effect log, keyed by this call's id (a write).",
    parameters: z.object({ note: z.string().max(200) }),
    effect: "write",
    async execute(args, context) {
      const response = await fetch(`${effectLogUrl}/effects`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ key: context.invocationId, runId: context.runId, note: args.note }),
        signal: withTimeout(context.signal),
      });
      const text = await response.text();
      if (!response.ok) throw new Error(`the effect log answered ${response.status}: ${text}`);
      return { ok: true, text: `effect ${context.invocationId} ${text}` };
    },
    async lookup(_args, context): Promise<LookupOutcome> {
      const response = await fetch(`${effectLogUrl}/effects/${encodeURIComponent(context.invocationId)}`, { signal: withTimeout(context.signal) });
      await response.text();
      if (response.status === 200) return "applied";
      if (response.status === 404) return "not_applied";
      return "unknown";
    },
  });
}
