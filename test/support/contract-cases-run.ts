// The contract cases of RunService (operators read and steer runs), beside the other services'
// in contract-cases.ts.
import { Code } from "@connectrpc/connect";
import { ACTOR, expectArray, expectField, LONG_REASON, MISSING_UUID, type ContractCase, type Seed } from "./contract-case-kit.js";

export function runServiceCases(seed: Seed): Record<string, ContractCase> {
  const live = { run_id: seed.liveRunId, actor: ACTOR, reason: "contract" };
  const settled = { run_id: seed.settledRunId, actor: ACTOR, reason: "contract" };
  return {
    // --- RunService: operators read and steer runs.
    "keel.v1.RunService/GetRun": {
      role: "operator",
      valid: { run_id: seed.liveRunId },
      expect: "ok",
      check: expectField(seed.liveRunId, "run", "id"),
      invalid: [{ request: { run_id: "not-a-uuid" }, field: "run_id" }],
      notFound: { run_id: MISSING_UUID },
    },
    "keel.v1.RunService/ListRuns": {
      role: "operator",
      valid: {},
      expect: "ok",
      check: expectArray("runs"),
      invalid: [
        { request: { agent_id: "Not A Slug" }, field: "agent_id" },
        { request: { conversation_id: "has space" }, field: "conversation_id" },
        // Opaque to clients, but a forged or corrupted token is still the caller's mistake, not Internal.
        { request: { page_token: Buffer.from("not-a-token").toString("base64url") }, field: "page_token" },
      ],
    },
    "keel.v1.RunService/ListRunSteps": {
      role: "operator",
      valid: { run_id: seed.liveRunId },
      expect: "ok",
      check: expectArray("steps"),
      invalid: [
        { request: { run_id: "" }, field: "run_id" },
        { request: { run_id: seed.liveRunId, page_token: Buffer.from("not-a-token").toString("base64url") }, field: "page_token" },
      ],
      notFound: { run_id: MISSING_UUID },
    },
    "keel.v1.RunService/GetRunStep": {
      role: "operator",
      // No worker runs in the matrix's Keel, so no run has steps: the valid request names a real
      // run and a well-formed step id that does not exist (first-slice reads a real step).
      valid: { run_id: seed.liveRunId, step_id: MISSING_UUID },
      expect: Code.NotFound,
      invalid: [{ request: { run_id: seed.liveRunId, step_id: "not-a-uuid" }, field: "step_id" }],
      notFound: { run_id: MISSING_UUID, step_id: MISSING_UUID },
    },
    "keel.v1.RunService/ListArtifacts": {
      role: "operator",
      valid: { run_id: seed.liveRunId },
      expect: "ok",
      check: expectArray("artifacts"),
      invalid: [{ request: { run_id: "not-a-uuid" }, field: "run_id" }],
      notFound: { run_id: MISSING_UUID },
    },
    "keel.v1.RunService/WatchRun": {
      role: "operator",
      // Ingress wrote the run's CREATED event, so the stream's first message proves it opened.
      valid: { run_id: seed.liveRunId },
      expect: "ok",
      check: expectField("RUN_EVENT_KIND_CREATED", "event", "kind"),
      invalid: [{ request: { run_id: "not-a-uuid" }, field: "run_id" }],
      notFound: { run_id: MISSING_UUID },
    },
    "keel.v1.RunService/GetWorkGraph": {
      role: "operator",
      // A loop-shaped run has no work graph: NotFound, not an empty graph.
      valid: { run_id: seed.liveRunId },
      expect: Code.NotFound,
      invalid: [{ request: { run_id: "not-a-uuid" }, field: "run_id" }],
      notFound: { run_id: MISSING_UUID },
    },
    "keel.v1.RunService/ResolveUnknownOutcome": {
      role: "operator",
      // The live run has no tool invocation in unknown_outcome to resolve.
      valid: { run_id: seed.liveRunId, tool_invocation_id: MISSING_UUID, outcome: "RESOLVED_OUTCOME_APPLIED", actor: ACTOR, reason: "checked" },
      expect: Code.FailedPrecondition,
      invalid: [
        { request: { run_id: seed.liveRunId, tool_invocation_id: "nope", outcome: "RESOLVED_OUTCOME_APPLIED", actor: ACTOR }, field: "tool_invocation_id" },
        { request: { run_id: seed.liveRunId, tool_invocation_id: MISSING_UUID, actor: ACTOR }, field: "outcome" },
      ],
      notFound: { run_id: MISSING_UUID, tool_invocation_id: MISSING_UUID, outcome: "RESOLVED_OUTCOME_APPLIED", actor: ACTOR },
    },
    "keel.v1.RunService/PauseRun": {
      role: "operator",
      // Pausing is idempotent, so the live run can take it four times.
      valid: live,
      expect: "ok",
      check: expectField(true, "run", "paused"),
      invalid: [{ request: { ...live, reason: LONG_REASON }, field: "reason" }],
      notFound: { ...live, run_id: MISSING_UUID },
    },
    "keel.v1.RunService/ResumeRun": {
      role: "operator",
      valid: settled,
      expect: Code.FailedPrecondition,
      invalid: [{ request: { ...settled, run_id: "not-a-uuid" }, field: "run_id" }],
      notFound: { ...settled, run_id: MISSING_UUID },
    },
    "keel.v1.RunService/RequeueRun": {
      role: "operator",
      // Requeueing a queued run is a no-op that answers with the run, still queued.
      valid: live,
      expect: "ok",
      check: expectField("RUN_STATUS_QUEUED", "run", "status"),
      invalid: [{ request: { run_id: seed.liveRunId, reason: "no actor" }, field: "actor" }],
      notFound: { ...live, run_id: MISSING_UUID },
    },
    "keel.v1.RunService/CancelRun": {
      role: "operator",
      // A settled run refuses, saying how it ended, the same every time.
      valid: settled,
      expect: Code.FailedPrecondition,
      invalid: [{ request: { ...live, reason: "" }, field: "reason" }],
      notFound: { ...settled, run_id: MISSING_UUID },
    },
    "keel.v1.RunService/DecideGate": {
      role: "operator",
      // A loop-shaped run has no work graph, so no gate to decide.
      valid: { run_id: seed.liveRunId, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_REJECT", reason: "checked" },
      expect: Code.NotFound,
      invalid: [
        { request: { run_id: seed.liveRunId, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_REJECT", reason: " " }, field: "reason" },
        { request: { run_id: seed.liveRunId, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_UNSPECIFIED", reason: "checked" }, field: "decision" },
      ],
      notFound: { run_id: MISSING_UUID, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_REJECT", reason: "checked" },
    },
    "keel.v1.RunService/ListSandboxHosts": {
      role: "operator",
      valid: { page_size: 10 },
      expect: "ok",
      // Empty until a host attaches (proto JSON then omits the field); a list of hosts after.
      check: (response) => {
        if (!Array.isArray(response.hosts ?? [])) throw new Error(`response.hosts: expected a list, got ${JSON.stringify(response.hosts)}`);
      },
      invalid: [{ request: { page_token: "not-a-token" }, field: "page_token" }],
    },
    "keel.v1.RunService/ForkRun": {
      role: "operator",
      // The seeded runs have no committed step to fork from.
      valid: { ...settled, step_index: 0 },
      expect: Code.FailedPrecondition,
      invalid: [{ request: { ...settled, step_index: 0, reason: " " }, field: "reason" }],
      notFound: { ...settled, step_index: 0, run_id: MISSING_UUID },
    },
  };
}
