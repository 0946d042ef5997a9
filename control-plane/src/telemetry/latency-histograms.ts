// Latency histograms of this process's loop (steps, model calls, tool calls) in Prometheus text.
// Unlike the ledger gauges, these are per replica: a scraper sums them across replicas.
import type { PhaseLatencies, TimedPhase } from "../runner/run-telemetry.js";

/** Upper bounds in seconds: a scripted step takes milliseconds, an exec or a slow model minutes. */
export const LATENCY_BUCKETS_S: readonly number[] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

interface Family {
  readonly name: string;
  readonly help: string;
  /** The label a recorded value's `label` goes under; none for steps. */
  readonly labelName: string | undefined;
}

const FAMILIES: Readonly<Record<TimedPhase, Family>> = {
  step: {
    name: "keel_step_duration_seconds",
    help: "One loop iteration in this process: its model call, the step's commit and its tool calls.",
    labelName: undefined,
  },
  model_call: { name: "keel_model_call_duration_seconds", help: "One model call of the loop in this process, by provider.", labelName: "provider" },
  tool_call: { name: "keel_tool_call_duration_seconds", help: "One tool call's execution in this process, by tool.", labelName: "tool" },
};

/** Counts per bucket (not cumulative: rendering adds them up), their sum and count. */
class Histogram {
  readonly counts = new Float64Array(LATENCY_BUCKETS_S.length);
  sum = 0;
  count = 0;

  observe(seconds: number): void {
    this.sum += seconds;
    this.count += 1;
    for (let i = 0; i < LATENCY_BUCKETS_S.length; i++) {
      if (seconds <= LATENCY_BUCKETS_S[i]!) {
        this.counts[i]! += 1;
        return;
      }
    }
  }
}

export interface LatencyHistograms extends PhaseLatencies {
  /** The histograms in Prometheus text format (0.0.4), ending with a newline. */
  render(): string;
}

/** Label values escaped as the text format asks (backslash, quote, newline). */
const escapeLabel = (value: string) => value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");

const formatBound = (bound: number) => (Number.isInteger(bound) ? `${bound}.0` : String(bound));

export function createLatencyHistograms(): LatencyHistograms {
  // A histogram per phase and label value, made on the first value: recording allocates nothing after that.
  const byPhase: Record<TimedPhase, Map<string, Histogram>> = { step: new Map(), model_call: new Map(), tool_call: new Map() };
  byPhase.step.set("", new Histogram());
  return {
    record(phase, ms, label = "") {
      const histograms = byPhase[phase];
      let histogram = histograms.get(label);
      if (histogram === undefined) histograms.set(label, (histogram = new Histogram()));
      histogram.observe(Math.max(0, ms) / 1000);
    },
    render() {
      const lines: string[] = [];
      for (const phase of Object.keys(FAMILIES) as TimedPhase[]) {
        const family = FAMILIES[phase];
        lines.push(`# HELP ${family.name} ${family.help}`, `# TYPE ${family.name} histogram`);
        const labels = [...byPhase[phase].keys()].sort();
        for (const label of labels) {
          const histogram = byPhase[phase].get(label)!;
          const own = family.labelName === undefined ? "" : `${family.labelName}="${escapeLabel(label)}"`;
          const withLe = (le: string) => `{${own === "" ? "" : `${own},`}le="${le}"}`;
          let cumulative = 0;
          for (const [i, bound] of LATENCY_BUCKETS_S.entries()) {
            cumulative += histogram.counts[i]!;
            lines.push(`${family.name}_bucket${withLe(formatBound(bound))} ${cumulative}`);
          }
          lines.push(`${family.name}_bucket${withLe("+Inf")} ${histogram.count}`);
          const plain = own === "" ? "" : `{${own}}`;
          lines.push(`${family.name}_sum${plain} ${histogram.sum.toFixed(6)}`, `${family.name}_count${plain} ${histogram.count}`);
        }
      }
      return `${lines.join("\n")}\n`;
    },
  };
}
