// Tools for tests. The write tool counts its executions in a file outside the ledger,
// so a test can prove that no write ever ran twice.
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { z } from "zod";
import { defineTool, type ToolDefinition } from "../../control-plane/src/tools/tool-registry.js";

export interface TestToolOptions {
  /** Folder where the write tool appends one line per execution. */
  readonly effectsDir: string;
  /** Optional delay inside each tool, to give a test a window mid-execution. */
  readonly delayMs?: number;
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (ms <= 0) return resolve();
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason as Error)), { once: true });
  });

export function effectsFile(effectsDir: string): string {
  return path.join(effectsDir, "writes.log");
}

/** Lines the write tool appended: one per real execution, `<invocationId> <key>`. */
export function writesRecorded(effectsDir: string): string[] {
  const file = effectsFile(effectsDir);
  return existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l !== "") : [];
}

export function createTestTools(options: TestToolOptions): ToolDefinition[] {
  return [
    defineTool<{ text: string }>({
      name: "test.echo",
      version: 1,
      description: "Returns its text (a read).",
      parameters: z.object({ text: z.string().max(100_000) }),
      effect: "read",
      async execute(args, context) {
        await sleep(options.delayMs ?? 0, context.signal);
        await context.observe("stdout", args.text);
        return { ok: true, text: `echo: ${args.text}` };
      },
    }),
    defineTool<{ path: string }>({
      name: "test.read_path",
      version: 1,
      description: "Pretends to read a file at a path (a read with a path field for policy tests).",
      parameters: z.object({ path: z.string() }),
      effect: "read",
      execute(args) {
        return Promise.resolve({ ok: true, text: `contents of ${args.path}` });
      },
    }),
    defineTool<{ key: string }>({
      name: "test.append_line",
      version: 1,
      description: "Appends a line to the effects log (a write: an external effect).",
      parameters: z.object({ key: z.string().min(1).max(200) }),
      effect: "write",
      async execute(args, context) {
        appendFileSync(effectsFile(options.effectsDir), `${context.invocationId} ${args.key}\n`);
        await sleep(options.delayMs ?? 0, context.signal);
        return { ok: true, text: `appended ${args.key}`, artifacts: [{ type: "line", schemaVersion: "1", provenance: "observed", inlineData: args.key }] };
      },
    }),
  ];
}
