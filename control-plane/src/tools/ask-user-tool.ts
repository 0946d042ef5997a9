import { z } from "zod";
import { defineTool } from "./tool-registry.js";

/**
 * Parks the run in awaiting_input and puts the question to the conversation. Any actor
 * of the conversation may answer (IngressService.AnswerInput); the answer becomes this
 * call's result, so the model's transcript stays a valid call/result pairing.
 */
export const askUserTool = defineTool<{ question: string }>({
  name: "keel.ask_user",
  version: 1,
  description:
    "Ask the people in this conversation a clarifying question when you lack information you need to continue. The run waits for an answer.",
  parameters: z.object({ question: z.string().min(1).max(4000).describe("The question, as it should appear in the conversation") }),
  effect: "read",
  parksForInput: true,
  execute() {
    return Promise.reject(new Error("keel.ask_user is answered by an actor, never executed"));
  },
});
