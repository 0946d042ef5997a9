// One run: what it is doing, why it stopped, what it spent, and who steered it.
import type { Run, RunEvent } from "../../gen/keel/v1/run_pb.js";
import { dateOf, eventKindLabel, statusLabel, waitReasonLabel } from "./format.js";
import { ActionsPanel, BudgetPanel } from "./run-panels.js";
import { useRunStream } from "./run-stream.js";
import { Timeline } from "./timeline.js";
import { mayHaveWorkGraph, WorkGraphView } from "./work-graph.js";

export function RunPage(props: { readonly runId: string; readonly actor: string }) {
  const view = useRunStream(props.runId);
  const { run } = view;
  return (
    <article class="run" aria-labelledby="run-title">
      <div class="toolbar">
        <a href="#/">← Runs</a>
        <h1 id="run-title" class="mono">
          Run {props.runId}
        </h1>
        <span class={`live-dot${view.live ? " on" : ""}`} data-live={view.live ? "yes" : "no"}>
          {view.live ? "live" : "not streaming"}
        </span>
      </div>
      <p class="error" role="alert">
        {view.error}
      </p>
      {run === undefined ? (
        <p class="muted">Loading…</p>
      ) : (
        <div class="run-grid">
          <div class="run-main">
            <RunFacts run={run} />
            {mayHaveWorkGraph(run) ? <WorkGraphView run={run} actor={props.actor} /> : null}
            <h2>Timeline</h2>
            <Timeline steps={view.steps} actor={props.actor} onResolved={view.refreshStep} onExpand={view.expandStep} />
          </div>
          <aside class="run-side">
            <ActionsPanel run={run} actor={props.actor} onChanged={view.setRun} />
            <BudgetPanel run={run} />
            <Events events={view.events} />
            <section class="panel" aria-labelledby="artifacts-title">
              <h2 id="artifacts-title">Artifacts</h2>
              {view.artifacts.length === 0 ? (
                <p class="muted">None.</p>
              ) : (
                <ul class="artifacts">
                  {view.artifacts.map((a) => (
                    <li key={a.id}>
                      <span class="mono">{a.type}</span> v{a.schemaVersion} · {["", "model", "observed", "verified"][a.provenance] ?? ""} · {a.inlineData || a.reference}
                    </li>
                  ))}
                </ul>
              )}
            </section>
          </aside>
        </div>
      )}
    </article>
  );
}

function RunLink(props: { readonly id: string }) {
  return props.id === "" ? <span class="muted">—</span> : <a class="mono" href={`#/runs/${props.id}`}>{props.id.slice(0, 8)}</a>;
}

function RunFacts(props: { readonly run: Run }) {
  const { run } = props;
  const status = statusLabel(run.status);
  const wait = waitReasonLabel(run.waitReason);
  return (
    <section class="facts-panel" aria-label="run facts">
      <div class="status-line">
        <span class={`badge big s-${status}`} data-testid="run-status">
          {status}
        </span>
        {run.paused ? (
          <span class="badge big s-paused" data-testid="run-paused">
            paused
          </span>
        ) : null}
        <span class="muted" data-testid="wait-reason">
          {wait === "" ? "" : `waiting on ${wait}`}
          {run.queuePosition === 0 ? "" : ` · queue position ${run.queuePosition}`}
        </span>
      </div>
      <dl class="facts">
        <dt>Agent</dt>
        <dd>{run.agentId}</dd>
        <dt>Conversation</dt>
        <dd>{run.conversationId}</dd>
        <dt>Connector</dt>
        <dd>{run.connector || "—"}</dd>
        <dt>Requested by</dt>
        <dd>{run.requestedBy?.displayName || run.requestedBy?.id || "—"}</dd>
        <dt>Created</dt>
        <dd>{dateOf(run.createdAt)?.toLocaleString() ?? "—"}</dd>
        <dt>Finished</dt>
        <dd>{dateOf(run.finishedAt)?.toLocaleString() ?? "—"}</dd>
        <dt>Parent / root</dt>
        <dd>
          <RunLink id={run.parentRunId} /> / <RunLink id={run.rootRunId} />
        </dd>
        <dt>Continues</dt>
        <dd>
          <RunLink id={run.continuationOfRunId} />
        </dd>
        <dt>Forked from</dt>
        <dd data-testid="forked-from">
          <RunLink id={run.forkedFromRunId} />
          {run.forkedFromRunId === "" ? "" : ` at step ${run.forkedAtStep}: ${run.forkReason}`}
        </dd>
        <dt>Forks</dt>
        <dd data-testid="forks">
          {run.forkRunIds.length === 0 ? <span class="muted">—</span> : run.forkRunIds.map((id) => <RunLink key={id} id={id} />)}
        </dd>
        <dt>Superseded by</dt>
        <dd>
          <RunLink id={run.supersededByRunId} />
        </dd>
        {run.cancelledByActorId === "" ? null : (
          <>
            <dt>Cancelled by</dt>
            <dd>{run.cancelledByActorId}</dd>
          </>
        )}
        <dt>Reply</dt>
        <dd class="reply" data-testid="final-reply">
          {run.finalReply || "—"}
        </dd>
        {run.error === "" ? null : (
          <>
            <dt>Error</dt>
            <dd class="error">{run.error}</dd>
          </>
        )}
      </dl>
      <h2>Triggers</h2>
      <ul class="triggers">
        {run.triggers.map((t) => (
          <li key={t.messageId}>
            <span class="mono">{t.messageId}</span> from <strong>{t.actorId}</strong> at {dateOf(t.receivedAt)?.toLocaleTimeString() ?? "?"}
          </li>
        ))}
      </ul>
    </section>
  );
}

function Events(props: { readonly events: readonly RunEvent[] }) {
  return (
    <section class="panel" aria-labelledby="events-title">
      <h2 id="events-title">Events</h2>
      <ol class="events" aria-live="off">
        {props.events.map((e) => (
          <li key={String(e.seq)}>
            <span class="mono">#{String(e.seq)}</span> {eventKindLabel(e.kind)}
            {e.summary === "" ? "" : `: ${e.summary}`}
          </li>
        ))}
      </ol>
    </section>
  );
}
