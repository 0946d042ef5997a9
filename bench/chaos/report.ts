// The chaos suite's printed result: throughput per phase, faults by kind, the invariants with
// what each must be, the first problems found, and the RESULT line. Returns whether it failed.
import { table } from "../support.js";
import type { FaultRecord } from "./faults.js";
import type { InvariantReport } from "./invariants.js";
import type { WorkloadStats } from "./workload.js";

export interface ReportInput {
  readonly options: { readonly minutes: number; readonly seed: number };
  readonly calm: { readonly seconds: number; readonly finished: number };
  readonly chaos: { readonly seconds: number; readonly finished: number };
  readonly faults: readonly FaultRecord[];
  /** Replicas or agents that exited though no fault killed them. */
  readonly crashes: readonly string[];
  readonly faultKinds: readonly string[];
  readonly report: InvariantReport;
  readonly effectLog: { readonly fenced: number; readonly lookups: { readonly applied: number; readonly notApplied: number } };
  readonly workload: WorkloadStats & { readonly reconnects: number; readonly emissionsReceived: number };
}

const rate = (phase: { seconds: number; finished: number }) => (phase.seconds > 0 ? phase.finished / phase.seconds : 0);
const tally = (counts: Readonly<Record<string, number>>) =>
  Object.entries(counts)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${v}`)
    .join(" ");

export function printReport(say: (line: string) => void, input: ReportInput): boolean {
  const { report, faults } = input;
  const calmRate = rate(input.calm);
  const chaosRate = rate(input.chaos);
  const ratio = calmRate > 0 ? chaosRate / calmRate : 0;
  const faultErrors = faults.filter((f) => f.error !== undefined).length;
  // A database restart or a dying replica is a retryable condition (Unavailable, DeadlineExceeded); Internal or Unknown is a bug.
  const internalErrors = (input.workload.rpcErrors["Internal"] ?? 0) + (input.workload.rpcErrors["Unknown"] ?? 0);

  say("");
  say(`chaos result (seed ${input.options.seed})`);
  for (const line of table(
    ["phase", "seconds", "runs finished", "runs/s"],
    [
      ["calm", input.calm.seconds.toFixed(0), String(input.calm.finished), calmRate.toFixed(2)],
      ["chaos", input.chaos.seconds.toFixed(0), String(input.chaos.finished), chaosRate.toFixed(2)],
      ["chaos / calm", "", "", ratio.toFixed(2)],
    ],
  ))
    say(line);
  say("");
  for (const line of table(
    ["fault", "count", "recovery ms (mean)", "recovery ms (max)", "errors"],
    input.faultKinds.map((kind) => {
      const of = faults.filter((f) => f.kind === kind);
      const times = of.map((f) => f.recoveryMs);
      const mean = times.length === 0 ? 0 : times.reduce((a, b) => a + b, 0) / times.length;
      return [kind, String(of.length), mean.toFixed(0), String(Math.max(0, ...times)), String(of.filter((f) => f.error !== undefined).length)];
    }),
  ))
    say(line);
  say("");
  for (const line of table(
    ["check", "value", "must be"],
    [
      ["runs", String(report.runs), ""],
      ["faults", String(faults.length), ""],
      ["effects", String(report.effects), ""],
      ["duplicates", String(report.duplicates), "0"],
      ["lost", String(report.lost), "0"],
      ["stuck", String(report.stuck), "0"],
      ["unsettled (still leased)", String(report.unsettled), "0"],
      ["effects without a done intent", String(report.unintended), "0"],
      ["fault recoveries failed", String(faultErrors), "0"],
      ["processes that exited unasked", String(input.crashes.length), "0"],
      ["RPCs answered Internal or Unknown", String(internalErrors), "0"],
      ["writes waiting on unknown outcome", String(report.unknownOutcomes), ""],
      ["late writes fenced by a lookup", String(input.effectLog.fenced), ""],
    ],
  ))
    say(line);
  say("");
  say(`runs by status: ${tally(report.byStatus)}`);
  say(`external writes by outcome: ${tally(report.writes)}; lookups applied=${input.effectLog.lookups.applied} not_applied=${input.effectLog.lookups.notApplied}`);
  say(`sandbox calls by outcome: ${tally(report.execs)}`);
  say(
    `workload: submitted=${input.workload.submitted} unacknowledged=${input.workload.unacknowledged} submit_retries=${input.workload.submitRetries} ` +
      `emissions_received=${input.workload.emissionsReceived} stream_reconnects=${input.workload.reconnects} rpc_errors: ${tally(input.workload.rpcErrors) || "none"}`,
  );
  for (const [why, n] of Object.entries(report.execFailures)) say(`  sandbox call ${why} (${n}x)`);
  for (const problem of report.problems) say(`  ${problem}`);
  for (const crash of input.crashes) say(`  unexpected exit: ${crash}`);

  // A replica or agent that dies of a fault it did not receive is a bug too (an unhandled error).
  const failed = report.duplicates + report.lost + report.stuck + report.unsettled + report.unintended + faultErrors + input.crashes.length + internalErrors > 0;
  say(
    `RESULT chaos runs=${report.runs} faults=${faults.length} duplicates=${report.duplicates} lost=${report.lost} stuck=${report.stuck} ` +
      `chaos_vs_calm=${ratio.toFixed(2)} unsettled=${report.unsettled} unintended=${report.unintended} fault_errors=${faultErrors} crashes=${input.crashes.length} internal_errors=${internalErrors} ` +
      `calm_runs_per_s=${calmRate.toFixed(2)} chaos_runs_per_s=${chaosRate.toFixed(2)} minutes=${input.options.minutes} ${failed ? "FAILED" : "OK"}`,
  );
  return failed;
}
