// One run, kept current by RunService.WatchRun: the page loads the run, its steps and artifacts
// once, then each streamed event fetches only what it names (the step it touched) and refreshes
// the run's header at most a few times a second. A dropped stream resumes after the last seq.
import { useEffect, useRef, useState } from "preact/hooks";
import { ResolvedOutcome, ToolInvocationStatus, type Artifact, type Run, type RunEvent, type RunStep } from "../../gen/keel/v1/run_pb.js";
import { RunStepView } from "../../gen/keel/v1/run_service_pb.js";
import { runService } from "./client.js";
import { errorText, isTerminal } from "./format.js";

/** Events kept on screen; older ones are in the ledger (and `keel inspect`). */
const MAX_EVENTS = 300;
const RUN_REFRESH_MS = 250;
const RECONNECT_MS = 1_000;
/** Step summaries per ListRunSteps page (the server's most). */
const STEPS_PAGE_SIZE = 500;
/** An exec's output lands as observations, which write no run event: a running call's step is fetched this often. */
const OUTPUT_POLL_MS = 500;

export interface RunView {
  readonly run: Run | undefined;
  /** Ordered by step index. */
  readonly steps: readonly RunStep[];
  readonly events: readonly RunEvent[];
  readonly artifacts: readonly Artifact[];
  readonly error: string;
  readonly live: boolean;
  /** Replaces the run with one an action returned. */
  readonly setRun: (run: Run) => void;
  /** Fetches one step again (after an action changed it). */
  readonly refreshStep: (stepId: string) => void;
  /** Keeps one step whole from now on (its row was opened), fetching it. */
  readonly expandStep: (stepId: string) => void;
}

/**
 * Steps the server sent in its SUMMARY view: what a closed row shows, without the model request
 * (which repeats the whole transcript so far) or the tools' output. Kept whole, a 1,000-step run
 * held 131 MB in the page; a row's step is fetched whole when it is opened, and kept so.
 */
const summaries = new WeakSet<RunStep>();

/** True when the step lacks its request transcript, arguments, results and output: open it to fetch them. */
export const isSummary = (step: RunStep): boolean => summaries.has(step);

/** A step whose tool calls may still change without an event naming the step (requeue, resolution). */
const unsettled = (step: RunStep) =>
  step.toolInvocations.some(
    (tool) => tool.status === ToolInvocationStatus.PENDING || (tool.status === ToolInvocationStatus.UNKNOWN_OUTCOME && tool.resolvedOutcome === ResolvedOutcome.UNSPECIFIED),
  );

const running = (tool: RunStep["toolInvocations"][number]) => tool.status === ToolInvocationStatus.PENDING;

/** A committed step whose tool calls are settled no longer changes: an event naming it needs no fetch. */
const final = (step: RunStep) => step.committedAt !== undefined && !unsettled(step);

/** Streamed events reach the page's state at most this often: a long run replays thousands at once. */
const EVENT_FLUSH_MS = 100;

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
  });

export function useRunStream(runId: string): RunView {
  const [run, setRun] = useState<Run | undefined>(undefined);
  const [steps, setSteps] = useState<ReadonlyMap<string, RunStep>>(new Map());
  const [events, setEvents] = useState<readonly RunEvent[]>([]);
  const [artifacts, setArtifacts] = useState<readonly Artifact[]>([]);
  const [error, setError] = useState("");
  const [live, setLive] = useState(false);
  const latestSteps = useRef<ReadonlyMap<string, RunStep>>(steps);
  latestSteps.current = steps;
  const refetch = useRef<(stepId: string) => void>(() => undefined);
  const stableRefresh = useRef((stepId: string) => refetch.current(stepId));
  const ordered = useRef<{ map: ReadonlyMap<string, RunStep>; list: readonly RunStep[] }>({ map: new Map(), list: [] });
  const whole = useRef(new Set<string>());
  const stableExpand = useRef((stepId: string) => {
    whole.current.add(stepId);
    refetch.current(stepId);
  });

  useEffect(() => {
    const stop = new AbortController();
    const { signal } = stop;
    const upsertSteps = (fresh: readonly RunStep[], asSummaries: boolean) =>
      setSteps((before) => {
        const next = new Map(before);
        for (const step of fresh) {
          if (asSummaries) {
            // A summary asked for before its row was opened never replaces the whole step.
            const known = before.get(step.id);
            if (whole.current.has(step.id) && known !== undefined && !summaries.has(known)) continue;
            summaries.add(step);
          }
          next.set(step.id, step);
        }
        return next;
      });

    let refreshDue: ReturnType<typeof setTimeout> | undefined;
    const refreshRun = async () => {
      const reply = await runService.getRun({ runId }, { signal });
      if (reply.run !== undefined) setRun(reply.run);
    };
    const scheduleRefresh = () => {
      refreshDue ??= setTimeout(() => {
        refreshDue = undefined;
        refreshRun().catch((caught: unknown) => signal.aborted || setError(errorText(caught)));
      }, RUN_REFRESH_MS);
    };

    const pendingSteps = new Set<string>();
    let fetching = false;
    const fetchSteps = async () => {
      if (fetching) return;
      fetching = true;
      try {
        while (pendingSteps.size > 0 && !signal.aborted) {
          const ids = [...pendingSteps];
          pendingSteps.clear();
          const [open, closed] = [ids.filter((id) => whole.current.has(id)), ids.filter((id) => !whole.current.has(id))];
          const get = (stepIds: readonly string[], view: RunStepView) =>
            Promise.all(stepIds.map((stepId) => runService.getRunStep({ runId, stepId, view }, { signal }))).then((replies) =>
              replies.flatMap((reply) => (reply.step === undefined ? [] : [reply.step])),
            );
          const [wholeSteps, summarySteps] = await Promise.all([get(open, RunStepView.FULL), get(closed, RunStepView.SUMMARY)]);
          upsertSteps(wholeSteps, false);
          upsertSteps(summarySteps, true);
        }
      } finally {
        fetching = false;
      }
    };

    refetch.current = (stepId) => {
      pendingSteps.add(stepId);
      fetchSteps().catch((caught: unknown) => signal.aborted || setError(errorText(caught)));
    };

    const loadAll = async () => {
      const [runReply, artifactReply] = await Promise.all([runService.getRun({ runId }, { signal }), runService.listArtifacts({ runId }, { signal })]);
      if (runReply.run !== undefined) setRun(runReply.run);
      setArtifacts(artifactReply.artifacts);
      let pageToken = "";
      do {
        // Summaries, many to a page: a row fetches its whole step when opened.
        const page = await runService.listRunSteps({ runId, pageToken, pageSize: STEPS_PAGE_SIZE, view: RunStepView.SUMMARY }, { signal });
        upsertSteps(page.steps, true);
        pageToken = page.nextPageToken;
      } while (pageToken !== "" && !signal.aborted);
    };

    let arrived: RunEvent[] = [];
    let flushDue: ReturnType<typeof setTimeout> | undefined;
    const showEvent = (event: RunEvent) => {
      arrived.push(event);
      flushDue ??= setTimeout(() => {
        flushDue = undefined;
        const batch = arrived;
        arrived = [];
        setEvents((before) => [...before, ...batch].slice(-MAX_EVENTS));
      }, EVENT_FLUSH_MS);
    };

    const watch = async () => {
      let afterSeq = 0n;
      await loadAll();
      while (!signal.aborted) {
        try {
          setLive(true);
          for await (const { event } of runService.watchRun({ runId, afterSeq }, { signal })) {
            if (event === undefined) continue;
            afterSeq = event.seq;
            showEvent(event);
            if (event.stepId !== "") {
              // The history replays first: steps loaded since are already current.
              const known = latestSteps.current.get(event.stepId);
              if (known === undefined || !final(known)) refetch.current(event.stepId);
            }
            else for (const step of latestSteps.current.values()) if (unsettled(step)) refetch.current(step.id);
            scheduleRefresh();
          }
          // The server ends the stream once a settled run has nothing left to say.
          setLive(false);
          await refreshRun();
          setArtifacts((await runService.listArtifacts({ runId }, { signal })).artifacts);
          const latest = await runService.getRun({ runId }, { signal });
          if (latest.run !== undefined && isTerminal(latest.run.status)) return;
        } catch (caught) {
          if (signal.aborted) return;
          setLive(false);
          setError(errorText(caught));
          await sleep(RECONNECT_MS, signal);
          setError("");
        }
      }
    };
    watch().catch((caught: unknown) => signal.aborted || setError(errorText(caught)));
    const outputPoll = setInterval(() => {
      for (const step of latestSteps.current.values()) if (step.toolInvocations.some(running)) refetch.current(step.id);
    }, OUTPUT_POLL_MS);
    return () => {
      stop.abort();
      clearTimeout(refreshDue);
      clearTimeout(flushDue);
      clearInterval(outputPoll);
    };
  }, [runId]);

  // Sorting only when the set of steps changed keeps a streaming page cheap to re-render.
  if (ordered.current.map !== steps) ordered.current = { map: steps, list: [...steps.values()].sort((a, b) => a.index - b.index) };
  return { run, steps: ordered.current.list, events, artifacts, error, live, setRun, refreshStep: stableRefresh.current, expandStep: stableExpand.current };
}
