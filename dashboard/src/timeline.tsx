// A run's steps, oldest first. Each step is a <details> row whose summary has a fixed height, so
// a streaming run only ever appends. A run may have thousands of steps, and painting and
// hit-testing every row cost whole frames while scrolling (a Chromium trace of a 1,000-step run
// showed 20-50 ms paints), so only the blocks of rows near the viewport are in the document; each
// other block is one spacer of its exact height (its rows are closed, so rows x row height). A
// block holding an expanded step stays rendered, keeping its forms and their input.
import type { VNode } from "preact";
import { useCallback, useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { ResolvedOutcome, ToolInvocationStatus, type RunStep, type ToolInvocation } from "../../gen/keel/v1/run_pb.js";
import { runService } from "./client.js";
import { isSummary } from "./run-stream.js";
import { count, dateOf, effectLabel, errorText, ms, outcomeLabel, prettyJson, roleLabel, statusLabel, toolStatusLabel, usd } from "./format.js";
import { Transcript } from "./transcript.js";

/** Rows per block: blocks are rendered or replaced by a spacer whole. */
const BLOCK_ROWS = 10;
/** Blocks this far (px) above or below the viewport are rendered too, so scrolling meets rows already laid out. */
const MARGIN_PX = 400;
/** A closed row's height before one has been measured (2.25rem and its 1px border at 16px). */
const ESTIMATED_ROW_PX = 37;

type BlockRange = { readonly from: number; readonly to: number };

export function Timeline(props: {
  readonly steps: readonly RunStep[];
  readonly actor: string;
  readonly onResolved: (stepId: string) => void;
  /** A row was opened: its step is fetched whole and kept so. */
  readonly onExpand: (stepId: string) => void;
}) {
  // One element per step object, reused while the step is unchanged: Preact skips an identical
  // element, so a page of new steps arriving costs only the new rows, not the whole timeline.
  const rows = useRef(new WeakMap<RunStep, VNode>());
  const list = useRef<HTMLOListElement>(null);
  const expanded = useRef(new Set<string>());
  const [shown, setShown] = useState<BlockRange>({ from: 0, to: 2 });
  const [rowPx, setRowPx] = useState(0);
  const { onExpand } = props;
  const onToggle = useCallback(
    (step: RunStep, open: boolean) => {
      if (!open) return void expanded.current.delete(step.id);
      expanded.current.add(step.id);
      if (isSummary(step)) onExpand(step.id);
    },
    [onExpand],
  );

  // Which blocks meet the viewport and its margins, read from where each block starts on screen.
  const place = useCallback(() => {
    const ol = list.current;
    if (ol === null) return;
    const closed = ol.querySelector<HTMLElement>(":scope > li.step:not(.expanded)");
    // The exact (fractional) height: a rounded one makes every spacer a little off, and the
    // browser's scroll anchoring then moves the page at each swap.
    if (closed !== null) setRowPx((before) => (before === 0 ? closed.getBoundingClientRect().height : before));
    const starts = ol.querySelectorAll<HTMLElement>(":scope > [data-block]");
    const end = ol.getBoundingClientRect().bottom;
    const top = -MARGIN_PX;
    const bottom = window.innerHeight + MARGIN_PX;
    let from = -1;
    let to = 0;
    starts.forEach((start, i) => {
      const blockTop = start.getBoundingClientRect().top;
      const blockBottom = i + 1 < starts.length ? starts[i + 1]!.getBoundingClientRect().top : end;
      if (blockTop < bottom && blockBottom > top) {
        if (from < 0) from = i;
        to = i + 1;
      }
    });
    if (from < 0) from = to = 0;
    setShown((before) => (before.from === from && before.to === to ? before : { from, to }));
  }, []);

  useLayoutEffect(place);
  useEffect(() => {
    // Rows are swapped in a task of their own, between frames: inside the scroll event they
    // would lengthen the very frame that scrolls. The margin covers the frames it waits.
    let due: ReturnType<typeof setTimeout> | undefined;
    const later = () => {
      due ??= setTimeout(() => {
        due = undefined;
        place();
      }, 0);
    };
    addEventListener("scroll", later, { passive: true });
    addEventListener("resize", later, { passive: true });
    return () => {
      clearTimeout(due);
      removeEventListener("scroll", later);
      removeEventListener("resize", later);
    };
  }, [place]);

  const { steps } = props;
  if (steps.length === 0) return <p class="muted">No steps yet.</p>;
  const kept = new Set<number>();
  if (expanded.current.size > 0) steps.forEach((step, i) => expanded.current.has(step.id) && kept.add(Math.floor(i / BLOCK_ROWS)));
  const children: VNode[] = [];
  for (let block = 0; block * BLOCK_ROWS < steps.length; block++) {
    const first = block * BLOCK_ROWS;
    const last = Math.min(steps.length, first + BLOCK_ROWS);
    if ((block < shown.from || block >= shown.to) && !kept.has(block)) {
      const height = (last - first) * (rowPx || ESTIMATED_ROW_PX);
      children.push(<li key={`gap-${block}`} class="steps-gap" aria-hidden="true" data-block={block} style={{ height: `${height}px` }} />);
      continue;
    }
    for (let i = first; i < last; i++) {
      const step = steps[i]!;
      const startsBlock = i === first ? block : undefined;
      let row = rows.current.get(step);
      if (row === undefined || (row.props as { startsBlock?: number }).startsBlock !== startsBlock) {
        row = <StepRow key={step.id} step={step} actor={props.actor} onResolved={props.onResolved} onToggle={onToggle} startsBlock={startsBlock} />;
        rows.current.set(step, row);
      }
      children.push(row);
    }
  }
  return (
    <ol class="timeline" aria-label="steps" ref={list} data-steps={steps.length}>
      {children}
    </ol>
  );
}

function StepRow(props: {
  readonly step: RunStep;
  readonly actor: string;
  readonly onResolved: (stepId: string) => void;
  readonly onToggle: (step: RunStep, open: boolean) => void;
  /** The block this row starts, if it is a block's first row. */
  readonly startsBlock: number | undefined;
}) {
  const { step } = props;
  const call = step.modelCall;
  const tools = step.toolInvocations;
  const needsOperator = tools.some(awaitsResolution);
  // A closed step renders only its summary: a long run's transcripts are built when looked at.
  const [open, setOpen] = useState(false);
  return (
    <li class={open ? "step expanded" : "step"} data-step-index={step.index} data-block={props.startsBlock}>
      <details
        onToggle={(e) => {
          const now = e.currentTarget.open;
          props.onToggle(step, now);
          setOpen(now);
        }}
      >
        <summary>
          <span class="idx">#{step.index}</span>
          <span class="clip">{call === undefined ? "no model call" : `${roleLabel(call.role)} · ${call.model || call.provider}`}</span>
          <span class="clip">{tools.map((t) => `${t.toolName} → ${toolStatusLabel(t.status)}`).join(", ")}</span>
          <span class="num">{call?.usage === undefined ? "" : `${count(call.usage.inputTokens)}/${count(call.usage.outputTokens)} tok`}</span>
          <span class="num">{call === undefined ? "" : ms(call.latencyMs)}</span>
          <span class={`badge s-${statusLabel(step.runStatusAfter)}`}>{statusLabel(step.runStatusAfter)}</span>
          {needsOperator ? <span class="badge s-waiting">needs operator</span> : <span />}
        </summary>
        {!open ? null : isSummary(step) ? <p class="step-body muted">Loading…</p> : <div class="step-body">
          {call === undefined ? null : (
            <section class="model-call" aria-label="model call">
              <h3>
                Model call · {roleLabel(call.role)} · {call.provider}/{call.model}
              </h3>
              <dl class="facts">
                <dt>Tokens</dt>
                <dd>
                  {count(call.usage?.inputTokens ?? 0)} in / {count(call.usage?.outputTokens ?? 0)} out
                </dd>
                <dt>Cost</dt>
                <dd>{usd(call.costMicroUsd)}</dd>
                <dt>Latency</dt>
                <dd>{ms(call.latencyMs)}</dd>
                <dt>Finish</dt>
                <dd>{call.finishReason || "—"}</dd>
              </dl>
              <details>
                <summary>Request transcript</summary>
                <Transcript requestJson={call.requestJson} />
              </details>
              <h4>Response</h4>
              {call.responseText === "" ? <p class="muted">(no text)</p> : <div class="text response">{call.responseText}</div>}
              {call.toolCallsJson === "" || call.toolCallsJson === "[]" ? null : <pre class="block">{prettyJson(call.toolCallsJson)}</pre>}
            </section>
          )}
          {tools.map((tool) => (
            <ToolCall key={tool.id} tool={tool} actor={props.actor} onResolved={props.onResolved} />
          ))}
          {step.committedAt === undefined ? null : <ForkForm step={step} actor={props.actor} />}
        </div>}
      </details>
    </li>
  );
}

/** A call's output as one text, a chunk per line (a chunk's own final newline is not doubled). */
const observationText = (tool: ToolInvocation) =>
  tool.observations.map((o) => `[${o.stream}] ${o.text.endsWith("\n") ? o.text.slice(0, -1) : o.text}${o.truncated ? " …(truncated)" : ""}`).join("\n");

const awaitsResolution = (tool: ToolInvocation) => tool.status === ToolInvocationStatus.UNKNOWN_OUTCOME && tool.resolvedOutcome === ResolvedOutcome.UNSPECIFIED;

function ToolCall(props: { readonly tool: ToolInvocation; readonly actor: string; readonly onResolved: (stepId: string) => void }) {
  const { tool } = props;
  return (
    <section class="tool-call" aria-label={`tool call ${tool.toolName}`} data-tool-status={toolStatusLabel(tool.status)}>
      <h3>
        Tool call #{tool.ordinal} · <span class="mono">{tool.toolName}</span> · {effectLabel(tool.effect)} ·{" "}
        <span class="tool-status">{toolStatusLabel(tool.status)}</span>
      </h3>
      <pre class="block">{prettyJson(tool.argumentsJson)}</pre>
      <dl class="facts">
        <dt>Duration</dt>
        <dd>{tool.durationMs === 0 ? "—" : ms(tool.durationMs)}</dd>
        <dt>Finished</dt>
        <dd>{dateOf(tool.finishedAt)?.toLocaleTimeString() ?? "—"}</dd>
        {tool.refusalReason === "" ? null : (
          <>
            <dt>Refused</dt>
            <dd>{tool.refusalReason}</dd>
          </>
        )}
        {tool.resolvedOutcome === ResolvedOutcome.UNSPECIFIED ? null : (
          <>
            <dt>Resolved</dt>
            <dd class="resolution">
              {outcomeLabel(tool.resolvedOutcome)} by {tool.resolvedByActorId}: {tool.resolutionReason}
            </dd>
          </>
        )}
      </dl>
      {tool.resultText === "" ? null : <pre class="block result">{tool.resultText}</pre>}
      {tool.observations.length === 0 ? null : tool.status === ToolInvocationStatus.PENDING ? (
        // While the call runs its output is shown open, growing as the page fetches the step again.
        <section class="live-output" aria-label="live output">
          <h4>Output so far ({tool.observations.length} observations)</h4>
          <pre class="block" aria-live="polite">{observationText(tool)}</pre>
        </section>
      ) : (
        <details>
          <summary>{tool.observations.length} observations</summary>
          <pre class="block">{observationText(tool)}</pre>
        </details>
      )}
      {awaitsResolution(tool) ? <ResolveForm tool={tool} actor={props.actor} onResolved={props.onResolved} /> : null}
    </section>
  );
}

/** An unknown write outcome: the operator says whether the write took effect, and why they think so. */
function ResolveForm(props: { readonly tool: ToolInvocation; readonly actor: string; readonly onResolved: (stepId: string) => void }) {
  const [reason, setReason] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const resolve = async (outcome: ResolvedOutcome) => {
    if (reason.trim() === "") {
      setError("Say why: the reason is recorded with your name.");
      return;
    }
    setBusy(true);
    try {
      await runService.resolveUnknownOutcome({ runId: props.tool.runId, toolInvocationId: props.tool.id, outcome, actor: { id: props.actor }, reason: reason.trim() });
      props.onResolved(props.tool.stepId);
    } catch (caught) {
      setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="resolve" onSubmit={(e) => e.preventDefault()} aria-label="resolve unknown outcome">
      <p>The outcome of this write is unknown. Did it take effect?</p>
      <label>
        Reason
        <input name="resolve-reason" value={reason} onInput={(e) => setReason(e.currentTarget.value)} />
      </label>
      <button type="button" disabled={busy} onClick={() => void resolve(ResolvedOutcome.APPLIED)}>
        Applied
      </button>
      <button type="button" disabled={busy} onClick={() => void resolve(ResolvedOutcome.NOT_APPLIED)}>
        Not applied
      </button>
      <span class="error" role="alert">
        {error}
      </span>
    </form>
  );
}

/** A new run from this step: the transcript up to it, a fresh budget, the operator's reason. */
function ForkForm(props: { readonly step: RunStep; readonly actor: string }) {
  const [reason, setReason] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const fork = async () => {
    if (reason.trim() === "") {
      setError("Say what the fork tries out: the reason is recorded on it.");
      return;
    }
    setBusy(true);
    try {
      const reply = await runService.forkRun({ runId: props.step.runId, stepIndex: props.step.index, actor: { id: props.actor }, reason: reason.trim() });
      if (reply.run !== undefined) window.location.hash = `#/runs/${reply.run.id}`;
    } catch (caught) {
      setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="resolve fork" onSubmit={(e) => e.preventDefault()} aria-label={`fork from step ${props.step.index}`}>
      <label>
        Fork reason
        <input name="fork-reason" value={reason} onInput={(e) => setReason(e.currentTarget.value)} />
      </label>
      <button type="button" disabled={busy} onClick={() => void fork()}>
        Fork from step {props.step.index}
      </button>
      <span class="error" role="alert">
        {error}
      </span>
    </form>
  );
}
