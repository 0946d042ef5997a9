// A read tool (`test.gate.v1`) each call of which waits until the test opens it: the slow tool
// that holds a run at a known point, for as long as a test needs.
import { z } from "zod";
import { defineTool, type ToolDefinition } from "../../control-plane/src/tools/tool-registry.js";

export interface Gate {
  readonly tool: ToolDefinition;
  /** Resolves once a call waits at the named gate; fails after `timeoutMs`. */
  reached(name: string, timeoutMs?: number): Promise<void>;
  /** Lets the oldest call waiting at the named gate through. */
  open(name: string): void;
}

export function createGate(): Gate {
  const waiting = new Map<string, (() => void)[]>();
  const tool = defineTool<{ name: string }>({
    name: "test.gate",
    version: 1,
    description: "Waits until the test opens it (a read).",
    parameters: z.object({ name: z.string() }),
    effect: "read",
    execute: (args, context) =>
      new Promise((resolve, reject) => {
        const list = waiting.get(args.name) ?? [];
        list.push(() => resolve({ ok: true, text: `gate ${args.name} opened` }));
        waiting.set(args.name, list);
        context.signal.addEventListener("abort", () => reject(new Error("the worker stopped")), { once: true });
      }),
  });
  return {
    tool,
    async reached(name, timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      while ((waiting.get(name)?.length ?? 0) === 0) {
        if (Date.now() > deadline) throw new Error(`nothing reached gate ${name} within ${timeoutMs} ms`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
    open(name) {
      const next = waiting.get(name)?.shift();
      if (next === undefined) throw new Error(`nothing waits at gate ${name}`);
      next();
    },
  };
}
