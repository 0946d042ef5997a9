// Model calls the conversation makes beside the loop: the triage of a new request and the
// fast/decision questions of the mailbox. Each is recorded in the ledger against a run and
// counted in that run's usage; none of them is ever waited for by an admission.
import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import type { AgentSpec, ModelProviderName, ModelSpec } from "../domain/agent.js";
import { costMicroUsd } from "../domain/run.js";
import type { SideCallPurpose, SideCallRole, SideModelCall, TriageOutcome } from "../domain/triage.js";
import type { DecisionCall } from "../models/decision.js";
import type { ModelProvider } from "../models/model-provider.js";
import { triageRequest, type TriageCall } from "../models/triage.js";

/** The ledger's side of it (ledger/model-call.repository.ts). */
export interface SideCallLedger {
  /** Records the call against its run and adds it to the run's side usage, in one transaction. */
  recordSideCall(call: SideModelCall): Promise<void>;
  /** Stores a root run's triage on it, with the fast model's call behind it, in one transaction. */
  recordTriage(runId: string, outcome: TriageOutcome, call: SideModelCall): Promise<void>;
}

export interface SideCallDeps {
  readonly ledger: SideCallLedger;
  readonly providers: Readonly<Record<ModelProviderName, ModelProvider>>;
  readonly log: Logger;
}

/** A side call as the ledger records it. */
export function sideCall(runId: string, spec: ModelSpec, role: SideCallRole, purpose: SideCallPurpose, call: DecisionCall | TriageCall): SideModelCall {
  return {
    id: randomUUID(),
    runId,
    role,
    purpose,
    provider: spec.provider,
    model: spec.model === "" ? spec.provider : spec.model,
    request: call.request,
    responseText: call.responseText,
    inputTokens: call.usage.inputTokens,
    outputTokens: call.usage.outputTokens,
    latencyMs: call.latencyMs,
    finishReason: call.finishReason,
    costMicroUsd: costMicroUsd(call.usage, spec.prices),
  };
}

export interface Triager {
  /** Starts a root run's triage by the agent's fast model (see hasFastModel); returns at once. The run never waits for it. */
  start(runId: string, agent: AgentSpec, requestText: string): void;
  /** Waits for triages in flight (tests). */
  drain(): Promise<void>;
  /** Aborts triages in flight (each records its defaults) and waits for them: shutdown. */
  stop(): Promise<void>;
}

export function createTriager(deps: SideCallDeps): Triager {
  const inFlight = new Set<Promise<void>>();
  const stopping = new AbortController();

  async function run(runId: string, agent: AgentSpec, requestText: string): Promise<void> {
    const spec = agent.models.fast;
    const result = await triageRequest(deps.providers[spec.provider], spec, requestText, stopping.signal);
    if (result.fellBack !== undefined) deps.log.info({ runId, reason: result.fellBack }, "triage fell back to the defaults");
    await deps.ledger.recordTriage(runId, { triage: result.triage, fellBack: result.fellBack }, sideCall(runId, spec, "fast", "triage", result.call));
  }

  return {
    start(runId, agent, requestText) {
      // Deferred a turn so not even the call's set-up runs on the admission's path.
      const task = new Promise<void>((resolve) => setImmediate(resolve))
        .then(() => run(runId, agent, requestText))
        .catch((error: unknown) => deps.log.warn({ err: error, runId }, "triage could not be recorded; the run keeps its defaults"))
        .finally(() => inFlight.delete(task));
      inFlight.add(task);
    },
    async drain() {
      await Promise.allSettled([...inFlight]);
    },
    async stop() {
      stopping.abort(new Error("shutting down"));
      await Promise.allSettled([...inFlight]);
    },
  };
}
