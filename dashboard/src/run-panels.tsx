// The side panels of a run: budget use per dimension, and operator actions with a reason.
import { useEffect, useState } from "preact/hooks";
import type { RunBudget } from "../../gen/keel/v1/agent_pb.js";
import type { Run } from "../../gen/keel/v1/run_pb.js";
import { agentService, runService } from "./client.js";
import { count, errorText, isTerminal, ms, usd } from "./format.js";

interface Dimension {
  readonly name: string;
  readonly used: (run: Run) => number;
  /** The agent's limit; 0 means the server default, which the API does not say. */
  readonly limit: (budget: RunBudget) => number;
  readonly show: (value: number) => string;
}

const DIMENSIONS: readonly Dimension[] = [
  { name: "wall clock", used: (r) => Number(r.usage?.wallClockMs ?? 0), limit: (b) => b.maxWallClockMs, show: ms },
  { name: "iterations", used: (r) => r.usage?.iterations ?? 0, limit: (b) => b.maxIterations, show: count },
  { name: "model calls", used: (r) => r.usage?.modelCalls ?? 0, limit: (b) => b.maxModelCalls, show: count },
  { name: "tool calls", used: (r) => r.usage?.toolCalls ?? 0, limit: (b) => b.maxToolCalls, show: count },
  { name: "input tokens", used: (r) => Number(r.usage?.inputTokens ?? 0), limit: (b) => Number(b.maxInputTokens), show: count },
  { name: "output tokens", used: (r) => Number(r.usage?.outputTokens ?? 0), limit: (b) => Number(b.maxOutputTokens), show: count },
  { name: "output bytes", used: (r) => Number(r.usage?.outputBytes ?? 0), limit: (b) => Number(b.maxOutputBytes), show: count },
  { name: "cost", used: (r) => Number(r.usage?.costMicroUsd ?? 0), limit: (b) => Number(b.maxCostMicroUsd), show: usd },
];

/** Budget bars. Limits come from the agent's spec, which only an admin token may read. */
export function BudgetPanel(props: { readonly run: Run }) {
  const [budget, setBudget] = useState<RunBudget | undefined>(undefined);
  const [note, setNote] = useState("");
  useEffect(() => {
    const stop = new AbortController();
    agentService.getAgent({ agentId: props.run.agentId }, { signal: stop.signal }).then(
      (reply) => setBudget(reply.agent?.budget),
      () => setNote("Limits need a token that may read agents (admin); usage is shown alone."),
    );
    return () => stop.abort();
  }, [props.run.agentId]);
  return (
    <section class="panel" aria-labelledby="budget-title">
      <h2 id="budget-title">Budget</h2>
      <table class="budget">
        <tbody>
          {DIMENSIONS.map((d) => {
            const used = d.used(props.run);
            const limit = budget === undefined ? 0 : d.limit(budget);
            const share = limit > 0 ? Math.min(1, used / limit) : 0;
            return (
              <tr key={d.name} data-dimension={d.name}>
                <th scope="row">{d.name}</th>
                <td class="bar-cell">
                  <span class="bar" role="meter" aria-valuemin={0} aria-valuemax={limit || undefined} aria-valuenow={used} aria-label={d.name}>
                    <span class={`fill${share >= 0.9 ? " hot" : ""}`} style={{ width: `${(share * 100).toFixed(1)}%` }} />
                  </span>
                </td>
                <td class="num">
                  {d.show(used)}
                  {limit > 0 ? ` / ${d.show(limit)}` : ""}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {note === "" ? null : <p class="muted small">{note}</p>}
    </section>
  );
}

type Action = "pause" | "resume" | "requeue" | "cancel";

const DONE: Record<Action, string> = { pause: "paused", resume: "resumed", requeue: "requeued", cancel: "cancel requested" };

/** Pause, resume, requeue and cancel, each recorded with the operator's name and the reason given. */
export function ActionsPanel(props: { readonly run: Run; readonly actor: string; readonly onChanged: (run: Run) => void }) {
  const [reason, setReason] = useState("");
  const [message, setMessage] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const { run } = props;
  const terminal = isTerminal(run.status);

  const act = async (action: Action) => {
    if (reason.trim() === "") {
      setError("A reason is required; it is recorded with your name.");
      return;
    }
    setBusy(true);
    setError("");
    try {
      const request = { runId: run.id, actor: { id: props.actor }, reason: reason.trim() };
      const call = { pause: runService.pauseRun, resume: runService.resumeRun, requeue: runService.requeueRun, cancel: runService.cancelRun }[action];
      const reply = await call(request);
      if (reply.run !== undefined) props.onChanged(reply.run);
      setMessage(`${DONE[action]} by ${props.actor}`);
      setReason("");
    } catch (caught) {
      setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section class="panel" aria-labelledby="actions-title">
      <h2 id="actions-title">Actions</h2>
      <form class="actions" onSubmit={(e) => e.preventDefault()}>
        <label>
          Reason
          <input name="action-reason" value={reason} onInput={(e) => setReason(e.currentTarget.value)} disabled={terminal} />
        </label>
        <div class="buttons">
          <button type="button" disabled={busy || terminal || run.paused} onClick={() => void act("pause")}>
            Pause
          </button>
          <button type="button" disabled={busy || terminal || !run.paused} onClick={() => void act("resume")}>
            Resume
          </button>
          <button type="button" disabled={busy || terminal} onClick={() => void act("requeue")}>
            Requeue
          </button>
          <button type="button" class="danger" disabled={busy || terminal} onClick={() => void act("cancel")}>
            Cancel
          </button>
        </div>
        <p class="muted small" role="status">
          {terminal ? "The run has settled: no actions apply." : message}
        </p>
        <p class="error" role="alert">
          {error}
        </p>
      </form>
    </section>
  );
}
