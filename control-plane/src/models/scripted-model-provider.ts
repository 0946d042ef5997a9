// A deterministic, offline model: it plays the turns written in the agent spec, so runs,
// tests and demos behave the same on every machine without network or keys.

import type { ScriptedTurn } from "../domain/agent.js";
import { ModelProviderError } from "../domain/errors.js";
import type { ModelMessage, ModelTurn, ToolCallRequest } from "../domain/transcript.js";
import type { DecisionRequest, ModelProvider, ModelRequest } from "./model-provider.js";

const MESSAGE_PLACEHOLDER = "{{message}}";

/** Played when a spec scripts no turns, so a bare scripted agent still answers something useful. */
const ECHO_TURN: ScriptedTurn = {
  replyText: `Echo: ${MESSAGE_PLACEHOLDER}`,
  toolCalls: [],
  delayMs: 0,
  inputTokens: 0,
  outputTokens: 0,
};

/**
 * complete() plays `scriptedTurns[callIndex]`, repeating the last turn once the script runs
 * out. decide() answers the first scripted turn whose trimmed text names one of the choices
 * (case-insensitively), and throws otherwise so the caller uses its default. Triage asks the
 * fast model at call index 0, so a fast model's first turn scripts its triage (JSON) and a later
 * turn naming a relation scripts its follow-up answers.
 */
export function createScriptedModelProvider(): ModelProvider {
  return {
    async complete(request: ModelRequest): Promise<ModelTurn> {
      const turn = pickTurn(request.spec.scriptedTurns, request.callIndex);
      await abortableSleep(turn.delayMs, request.signal);
      const text = turn.replyText.split(MESSAGE_PLACEHOLDER).join(latestUserMessage(request.messages));
      const toolCalls = turn.toolCalls.map(
        (call, i): ToolCallRequest => ({
          id: `call_${request.callIndex}_${i}`,
          name: call.toolName,
          argumentsJson: call.argumentsJson,
        }),
      );
      return {
        text,
        toolCalls,
        usage: {
          inputTokens: turn.inputTokens > 0 ? turn.inputTokens : estimateTokens(messagesChars(request.messages)),
          outputTokens: turn.outputTokens > 0 ? turn.outputTokens : estimateTokens(replyChars(text, toolCalls)),
        },
        finishReason: toolCalls.length > 0 ? "tool_calls" : "stop",
      };
    },

    decide(request: DecisionRequest): Promise<string> {
      if (request.signal.aborted) return Promise.reject(abortError(request.signal));
      // The first scripted turn naming a choice, so one fast model can script a triage (a JSON
      // turn) and a follow-up classification (a choice) side by side.
      const turns = request.spec.scriptedTurns;
      const named = turns.find((turn) => request.choices.some((c) => c.toLowerCase() === turn.replyText.trim().toLowerCase()));
      const answer = (named ?? turns[0])?.replyText.trim().toLowerCase();
      const choice = request.choices.find((c) => c.toLowerCase() === answer);
      if (answer === undefined || choice === undefined) {
        return Promise.reject(new ModelProviderError("scripted decision model has no answer"));
      }
      request.onUsage?.({
        inputTokens: named !== undefined && named.inputTokens > 0 ? named.inputTokens : estimateTokens(request.question.length + request.choices.join(" ").length),
        outputTokens: named !== undefined && named.outputTokens > 0 ? named.outputTokens : estimateTokens(choice.length),
      });
      return Promise.resolve(choice);
    },
  };
}

function pickTurn(turns: readonly ScriptedTurn[], callIndex: number): ScriptedTurn {
  return turns[Math.min(callIndex, turns.length - 1)] ?? ECHO_TURN;
}

function latestUserMessage(messages: readonly ModelMessage[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const message = messages[i];
    if (message?.role === "user") return message.content;
  }
  return "";
}

/** The usual rule of thumb, ~4 characters a token; budgets need a number, not precision. */
function estimateTokens(chars: number): number {
  return Math.ceil(chars / 4);
}

function messagesChars(messages: readonly ModelMessage[]): number {
  let chars = 0;
  for (const message of messages) {
    chars += message.content.length;
    if (message.role === "assistant") chars += replyChars("", message.toolCalls);
  }
  return chars;
}

// Tool-call arguments count as output, or a turn of pure tool calls would cost nothing
// against the output-token budget.
function replyChars(text: string, toolCalls: readonly ToolCallRequest[]): number {
  return toolCalls.reduce((sum, call) => sum + call.name.length + call.argumentsJson.length, text.length);
}

function abortError(signal: AbortSignal): ModelProviderError {
  return new ModelProviderError("scripted model call aborted", { cause: signal.reason });
}

/** Rejects as soon as the signal aborts, so a cancelled run never waits out a scripted delay. */
function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(abortError(signal));
      return;
    }
    if (ms <= 0) {
      resolve();
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
