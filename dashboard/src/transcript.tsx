// A model call's request as a readable transcript. The ledger may store a request as a delta on
// the run's previous call ({ base, keep, messages }): then only the new messages are shown.
interface Message {
  readonly role?: string;
  readonly content?: string;
  readonly toolCalls?: readonly { readonly name?: string; readonly argumentsJson?: string }[];
  readonly toolCallId?: string;
}

function parse(requestJson: string): { messages: readonly Message[]; kept: number } | undefined {
  try {
    const value = JSON.parse(requestJson) as { messages?: unknown; keep?: unknown };
    if (!Array.isArray(value.messages)) return undefined;
    return { messages: value.messages as Message[], kept: typeof value.keep === "number" ? value.keep : 0 };
  } catch {
    return undefined;
  }
}

export function Transcript(props: { readonly requestJson: string }) {
  const parsed = parse(props.requestJson);
  if (parsed === undefined) return <pre class="block">{props.requestJson}</pre>;
  return (
    <ol class="transcript">
      {parsed.kept > 0 ? <li class="muted">… {parsed.kept} earlier messages, as in the previous call</li> : null}
      {parsed.messages.map((message, i) => (
        <li key={i} class={`msg m-${message.role ?? "unknown"}`}>
          <span class="who">{message.role ?? "?"}{message.toolCallId === undefined ? "" : ` (${message.toolCallId})`}</span>
          {message.content !== undefined && message.content !== "" ? <div class="text">{message.content}</div> : null}
          {(message.toolCalls ?? []).map((call, j) => (
            <div key={j} class="mono call">
              → {call.name ?? "?"} {call.argumentsJson ?? ""}
            </div>
          ))}
        </li>
      ))}
    </ol>
  );
}
