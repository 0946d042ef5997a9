// A run's WorkGraph (issue #15): one row per node in admitted order with its kind, status, inputs
// and attempts (each linking to its child run); a human gate shows its decision or, while it
// waits, the form that makes one. Child runs write no events on the root's stream, so the view
// polls GetWorkGraph once a second until the graph and the run have both settled.
import { Code, ConnectError } from "@connectrpc/connect";
import { useEffect, useState } from "preact/hooks";
import { ExecutionShape, type Run } from "../../gen/keel/v1/run_pb.js";
import { GateDecision, WorkNodeKind, WorkNodeStatus, type WorkGraph, type WorkNode, type WorkNodeAttempt } from "../../gen/keel/v1/work_graph_pb.js";
import { runService } from "./client.js";
import { count, dateOf, errorText, isTerminal, ms, usd } from "./format.js";

const POLL_MS = 1_000;

/** An enum value's name without its prefix, lowercase: WORK_NODE_KIND_HUMAN_GATE → human_gate. */
const label =
  (names: Record<number, string>) =>
  (value: number): string =>
    (names[value] ?? String(value)).toLowerCase();
const kindLabel = label(WorkNodeKind);
const nodeStatusLabel = label(WorkNodeStatus);
const DECIDED: Record<GateDecision, string> = { [GateDecision.UNSPECIFIED]: "", [GateDecision.APPROVE]: "approved", [GateDecision.REJECT]: "rejected" };

const SETTLED = new Set([WorkNodeStatus.SUCCEEDED, WorkNodeStatus.FAILED, WorkNodeStatus.CANCELLED]);
const waitingGate = (node: WorkNode) => node.kind === WorkNodeKind.HUMAN_GATE && node.status === WorkNodeStatus.BLOCKED;

const plural = (n: number | bigint, noun: string) => `${count(n)} ${noun}${Number(n) === 1 ? "" : "s"}`;

/** A graph root, or a run that may be one of a graph's children (GetWorkGraph answers for both). */
export const mayHaveWorkGraph = (run: Run) => run.shape === ExecutionShape.GRAPH || run.parentRunId !== "";

interface GraphView {
  readonly graph: WorkGraph | undefined;
  /** The run belongs to no graph (NotFound). */
  readonly missing: boolean;
  readonly error: string;
  readonly live: boolean;
  readonly setGraph: (graph: WorkGraph) => void;
}

function useWorkGraph(runId: string, runSettled: boolean, isRoot: boolean): GraphView {
  const [graph, setGraph] = useState<WorkGraph | undefined>(undefined);
  const [missing, setMissing] = useState(false);
  const [error, setError] = useState("");
  const [live, setLive] = useState(true);

  useEffect(() => {
    const stop = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async () => {
      let again = true;
      try {
        const reply = await runService.getWorkGraph({ runId }, { signal: stop.signal });
        setGraph(reply.graph);
        setMissing(false);
        setError("");
        again = !(runSettled && (reply.graph?.nodes ?? []).every((node) => SETTLED.has(node.status)));
      } catch (caught) {
        if (stop.signal.aborted) return;
        // A graph root's graph may not be readable for a moment; a child outside any graph has none.
        if (caught instanceof ConnectError && caught.code === Code.NotFound) {
          setMissing(true);
          again = isRoot && !runSettled;
        } else setError(errorText(caught));
      }
      setLive(again);
      if (again && !stop.signal.aborted) timer = setTimeout(() => void poll(), POLL_MS);
    };
    void poll();
    return () => {
      stop.abort();
      clearTimeout(timer);
    };
  }, [runId, runSettled, isRoot]);

  return { graph, missing, error, live, setGraph };
}

/** Arrow keys move focus between the nodes' rows (Tab reaches them and their controls too). */
function onNodesKey(event: KeyboardEvent) {
  if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
  const rows = [...document.querySelectorAll<HTMLLIElement>("ol.graph-nodes > li.graph-node")];
  const at = rows.indexOf(event.target as HTMLLIElement);
  if (at < 0) return;
  const next = rows[Math.min(rows.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)))];
  if (next !== undefined) {
    event.preventDefault();
    next.focus();
  }
}

export function WorkGraphView(props: { readonly run: Run; readonly actor: string }) {
  const view = useWorkGraph(props.run.id, isTerminal(props.run.status), props.run.shape === ExecutionShape.GRAPH);
  const { graph } = view;
  if (graph === undefined && view.missing) return null;
  const usage = graph?.aggregateUsage;
  const settled = graph?.nodes.filter((node) => SETTLED.has(node.status)).length ?? 0;
  return (
    <section class="work-graph" aria-labelledby="graph-title" data-testid="work-graph">
      <div class="graph-head">
        <h2 id="graph-title">Work graph</h2>
        {graph === undefined ? null : (
          <span class="muted small" data-testid="graph-summary">
            {settled} of {graph.nodes.length} nodes done · revision {graph.revision}
            {graph.replans === 0 ? "" : ` · ${graph.replans} replans`}
            {usage === undefined ? "" : ` · children spent ${plural(usage.modelCalls, "model call")}, ${plural(usage.inputTokens + usage.outputTokens, "token")}, ${usd(usage.costMicroUsd)}`}
          </span>
        )}
        <span class={`live-dot${view.live ? " on" : ""}`} data-graph-live={view.live ? "yes" : "no"}>
          {view.live ? "live" : "settled"}
        </span>
      </div>
      <p class="error" role="alert">
        {view.error}
      </p>
      {graph === undefined ? (
        <p class="muted">Loading the graph…</p>
      ) : (
        <ol class="graph-nodes" aria-label="work graph nodes" onKeyDown={onNodesKey}>
          {graph.nodes.map((node) => (
            <NodeRow key={node.id} node={node} runId={props.run.id} actor={props.actor} onDecided={view.setGraph} />
          ))}
        </ol>
      )}
    </section>
  );
}

function NodeRow(props: { readonly node: WorkNode; readonly runId: string; readonly actor: string; readonly onDecided: (graph: WorkGraph) => void }) {
  const { node } = props;
  const status = nodeStatusLabel(node.status);
  const gate = node.kind === WorkNodeKind.HUMAN_GATE;
  return (
    <li class={`graph-node${waitingGate(node) ? " waiting" : ""}`} tabIndex={0} data-node-key={node.key} data-node-status={status}>
      <div class="node-head">
        <span class="node-key mono">{node.key}</span>
        <span class="badge kind">{kindLabel(node.kind)}</span>
        <span class={`badge s-${status}`} data-testid="node-status">
          {waitingGate(node) ? "awaiting decision" : status}
        </span>
        <span class="muted small node-deps">{node.dependsOn.length === 0 ? "starts first" : `after ${node.dependsOn.join(", ")}`}</span>
      </div>
      <p class="node-objective">{node.objective}</p>
      {node.attempts.length === 0 ? null : (
        <ol class="attempts" aria-label={`attempts of ${node.key}`}>
          {node.attempts.map((attempt) => (
            <AttemptRow key={attempt.id} attempt={attempt} current={attempt.childRunId === props.runId} />
          ))}
        </ol>
      )}
      {!gate ? null : node.gateDecision !== GateDecision.UNSPECIFIED ? (
        <p class={`gate-decision d-${DECIDED[node.gateDecision]}`} data-testid="gate-decision">
          {DECIDED[node.gateDecision]} by <strong>{node.gateDecidedByActorId}</strong>: {node.gateReason}
        </p>
      ) : waitingGate(node) ? (
        <GateForm node={node} runId={props.runId} actor={props.actor} onDecided={props.onDecided} />
      ) : node.status === WorkNodeStatus.PENDING ? (
        <p class="muted small">Waits for a decision once the nodes before it have succeeded.</p>
      ) : null}
    </li>
  );
}

function AttemptRow(props: { readonly attempt: WorkNodeAttempt; readonly current: boolean }) {
  const { attempt } = props;
  const status = nodeStatusLabel(attempt.status);
  const started = dateOf(attempt.startedAt);
  const finished = dateOf(attempt.finishedAt);
  return (
    <li>
      attempt {attempt.ordinal} <span class={`badge s-${status}`}>{status}</span>
      {attempt.childRunId === "" ? null : (
        <>
          {" "}
          run{" "}
          <a class="mono child-run" href={`#/runs/${attempt.childRunId}`} aria-current={props.current ? "page" : undefined}>
            {attempt.childRunId.slice(0, 8)}
          </a>
          {props.current ? " (this run)" : ""}
        </>
      )}
      <span class="muted">
        {started === undefined ? "" : ` · started ${started.toLocaleTimeString()}`}
        {started === undefined || finished === undefined ? "" : ` · took ${ms(finished.getTime() - started.getTime())}`}
      </span>
    </li>
  );
}

/** Approve or reject a waiting gate, recorded with the signed-in operator's name and the reason. */
function GateForm(props: { readonly node: WorkNode; readonly runId: string; readonly actor: string; readonly onDecided: (graph: WorkGraph) => void }) {
  const [reason, setReason] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);

  const decide = async (decision: GateDecision) => {
    if (reason.trim() === "") {
      setError("A reason is required; it is recorded with your name.");
      return;
    }
    setBusy(true);
    setError("");
    try {
      const reply = await runService.decideGate({ runId: props.runId, gateId: props.node.id, actor: { id: props.actor }, decision, reason: reason.trim() });
      if (reply.graph !== undefined) props.onDecided(reply.graph);
    } catch (caught) {
      setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  };

  return (
    <form class="resolve gate" onSubmit={(e) => e.preventDefault()} aria-label={`decide gate ${props.node.key}`}>
      <p>Waiting for a decision: approve to let the nodes after it run, reject to fail it.</p>
      <label>
        Reason
        <input name="gate-reason" value={reason} onInput={(e) => setReason(e.currentTarget.value)} />
      </label>
      <button type="button" disabled={busy} onClick={() => void decide(GateDecision.APPROVE)}>
        Approve
      </button>
      <button type="button" class="danger" disabled={busy} onClick={() => void decide(GateDecision.REJECT)}>
        Reject
      </button>
      <p class="error" role="alert">
        {error}
      </p>
    </form>
  );
}
