import { z } from "zod";
import { MAX_PROGRESS_TEXT_CHARS, PROGRESS_KINDS } from "../domain/progress.js";
import { defineTool, type ToolDefinition } from "./tool-registry.js";

/** Where a committed checkpoint is announced: the run's progress supervisor looks at once. */
export interface CheckpointListener {
  checkpoint(runId: string): void;
}

/**
 * A checkpoint the agent offers the conversation (a plan, a milestone, a change of plan, a wait).
 * The call's committed intent is the checkpoint: the progress supervisor reads it from the ledger
 * and decides when it goes out (sooner than the cadence, never within a minute of the previous
 * notice, several at once as one). Executing it only tells the supervisor to look.
 */
export function createReportProgressTool(listener?: CheckpointListener): ToolDefinition {
  return defineTool<{ kind: string; text: string }>({
    name: "keel.report_progress",
    version: 1,
    description:
      "Tell the people in this conversation how a long task is going: your plan, a milestone reached, a change of plan, or what you are waiting for. One short sentence. It is posted at most once a minute; several reports close together become one.",
    parameters: z.object({
      kind: z.enum(PROGRESS_KINDS).describe("plan, milestone, replan or wait"),
      text: z.string().trim().min(1).max(MAX_PROGRESS_TEXT_CHARS).describe("One short sentence for the conversation"),
    }),
    effect: "read",
    execute(_args, context) {
      listener?.checkpoint(context.runId);
      return Promise.resolve({ ok: true, text: "Noted: it goes to the conversation with the next progress notice." });
    },
  });
}
