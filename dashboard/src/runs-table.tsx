// The runs table. RunService has no stream of all runs, so it polls ListRuns (one page, newest
// first); a run's own page streams. Rows have a fixed height so a refresh never shifts them.
import { useState } from "preact/hooks";
import { RunStatus, type Run } from "../../gen/keel/v1/run_pb.js";
import { runService } from "./client.js";
import { age, count, dateOf, FILTER_STATUSES, statusLabel, usd, waitReasonLabel } from "./format.js";
import { usePolling } from "./polling.js";

const POLL_MS = 1_000;
const PAGE_SIZE = 100;

/** Moves focus between the rows' links with the arrow keys (Tab works too). */
function onTableKey(event: KeyboardEvent) {
  if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
  const links = [...document.querySelectorAll<HTMLAnchorElement>("table.runs a.run-link")];
  const at = links.indexOf(document.activeElement as HTMLAnchorElement);
  const next = links[Math.min(links.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)))];
  if (next !== undefined) {
    event.preventDefault();
    next.focus();
  }
}

export function RunsTable() {
  const [status, setStatus] = useState<RunStatus>(RunStatus.UNSPECIFIED);
  const { value: runs, error, at: now } = usePolling(async (signal) => (await runService.listRuns({ status, pageSize: PAGE_SIZE }, { signal })).runs, POLL_MS, [status]);

  return (
    <section aria-labelledby="runs-title">
      <div class="toolbar">
        <h1 id="runs-title">Runs</h1>
        <label>
          Status
          <select name="status" value={String(status)} onChange={(e) => setStatus(Number(e.currentTarget.value) as RunStatus)}>
            <option value={String(RunStatus.UNSPECIFIED)}>any</option>
            {FILTER_STATUSES.map((s) => (
              <option key={s} value={String(s)}>
                {statusLabel(s)}
              </option>
            ))}
          </select>
        </label>
        <span class="muted live" aria-live="off">
          {runs === undefined ? "loading…" : `${runs.length} shown · refreshes every second`}
        </span>
      </div>
      <p class="error" role="alert">
        {error}
      </p>
      <table class="runs" onKeyDown={onTableKey}>
        <thead>
          <tr>
            <th scope="col">Status</th>
            <th scope="col">Run</th>
            <th scope="col">Agent</th>
            <th scope="col">Conversation</th>
            <th scope="col" class="num">Age</th>
            <th scope="col" class="num">Steps</th>
            <th scope="col" class="num">Tokens in/out</th>
            <th scope="col" class="num">Cost</th>
            <th scope="col">Waiting on</th>
            <th scope="col" class="num">Queue</th>
          </tr>
        </thead>
        <tbody>
          {(runs ?? []).map((run) => (
            <RunRow key={run.id} run={run} now={now} />
          ))}
        </tbody>
      </table>
      {runs !== undefined && runs.length === 0 ? <p class="muted">No runs{status === RunStatus.UNSPECIFIED ? "" : ` with status ${statusLabel(status)}`}.</p> : null}
    </section>
  );
}

function RunRow(props: { readonly run: Run; readonly now: number }) {
  const { run } = props;
  const usage = run.usage;
  const status = statusLabel(run.status);
  return (
    <tr data-run-id={run.id} data-status={status}>
      <td>
        <span class={`badge s-${status}`}>{status}</span>
        {run.paused ? <span class="badge s-paused">paused</span> : null}
      </td>
      <td class="mono">
        <a class="run-link" href={`#/runs/${run.id}`} title={run.id}>
          {run.id.slice(0, 8)}
        </a>
      </td>
      <td class="clip">{run.agentId}</td>
      <td class="clip" title={run.conversationId}>
        {run.conversationId}
      </td>
      <td class="num">{age(dateOf(run.createdAt), props.now)}</td>
      <td class="num">{run.stepCount}</td>
      <td class="num">{usage === undefined ? "" : `${count(usage.inputTokens)}/${count(usage.outputTokens)}`}</td>
      <td class="num">{usage === undefined ? "" : usd(usage.costMicroUsd)}</td>
      <td class="clip">{waitReasonLabel(run.waitReason)}</td>
      <td class="num">{run.queuePosition === 0 ? "" : run.queuePosition}</td>
    </tr>
  );
}
