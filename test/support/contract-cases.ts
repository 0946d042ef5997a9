// The API contract as a table: one case per RPC of every keel.v1 service.
//
// Requests are written the way a foreign client would write them: proto field names
// (snake_case), enum values by name, 64-bit integers as strings, a oneof member set by
// its own field name. That one shape is accepted both by @grpc/proto-loader (keepCase)
// and by protobuf-es `fromJson`, so a case is written once and sent by every client.
import type { DescMethod, DescService, JsonObject } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { AgentService } from "../../gen/keel/v1/agent_service_pb.js";
import { EmissionService } from "../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../../gen/keel/v1/run_service_pb.js";
import { SandboxService } from "../../gen/keel/v1/sandbox_service_pb.js";
import type { TokenRole } from "../../control-plane/src/ledger/api-token.repository.js";

/** Every service of the public contract; the suite walks their descriptors. */
export const CONTRACT_SERVICES: readonly DescService[] = [IngressService, EmissionService, RunService, AgentService, SandboxService];

export const ROLES: readonly TokenRole[] = ["connector", "sandbox-host", "operator", "admin"];

/** "keel.v1.IngressService/SubmitMessage": the gRPC path without the leading slash. */
export const methodKey = (method: DescMethod): string => `${method.parent.typeName}/${method.name}`;

export const allMethods = (): DescMethod[] => CONTRACT_SERVICES.flatMap((service) => service.methods);

/** One request; for a client- or bidi-streaming RPC, the messages the client sends, in order. */
export type RpcInput = JsonObject | readonly JsonObject[];

/**
 * What the right role gets for the valid request: "ok", or a code — Unimplemented for an RPC
 * not built yet, FailedPrecondition where the seeded run's state refuses it, NotFound, ...
 */
export type Expected = "ok" | Code;

export interface InvalidInput {
  readonly request: RpcInput;
  /** The proto field the InvalidArgument message must start with ("run_id: must be a UUID"). */
  readonly field: string;
}

export interface ContractCase {
  /** The role the service is for (auth.ts); admin may call everything, every other role is refused. */
  readonly role: TokenRole;
  readonly valid: RpcInput;
  readonly expect: Expected;
  /** Checks on the response (or first streamed message) of the valid request; fields are snake_case. */
  readonly check?: (response: JsonObject) => void;
  /** Bad inputs: InvalidArgument naming the field, never Internal. Empty only with a comment saying why. */
  readonly invalid: readonly InvalidInput[];
  /** Well-formed ids that do not exist: NotFound. */
  readonly notFound?: RpcInput;
}

/**
 * Ledger rows the valid requests point at, created through the API before the matrix runs.
 * The matrix's Keel runs no workers, so each run stays exactly where the seed left it, and
 * every valid request is idempotent: it is sent four times (two clients, role and admin).
 */
export interface Seed {
  /** Queued, and stays queued. */
  readonly liveRunId: string;
  /** Cancelled while queued: terminal. */
  readonly settledRunId: string;
  readonly emissionId: string;
  readonly connector: string;
}

// Well-formed ids that name nothing.
export const MISSING_UUID = "00000000-0000-4000-8000-000000000000";
export const ACTOR = { id: "contract-tester", display_name: "Contract Tester" };
const LONG_REASON = "x".repeat(4097);

const field = (value: unknown, ...path: string[]): unknown =>
  path.reduce<unknown>((node, key) => (node !== null && typeof node === "object" ? (node as Record<string, unknown>)[key] : undefined), value);

/** Throws unless the response field at `path` equals `expected`; vitest reports it like any failure. */
const expectField =
  (expected: unknown, ...path: string[]) =>
  (response: JsonObject): void => {
    const actual = field(response, ...path);
    if (actual !== expected) throw new Error(`response.${path.join(".")}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  };

const expectArray =
  (...path: string[]) =>
  (response: JsonObject): void => {
    if (!Array.isArray(field(response, ...path))) throw new Error(`response.${path.join(".")}: expected an array`);
  };

/** The case table. Keys are "package.Service/Method"; the suite fails on a method without a key and on a key without a method. */
export function contractCases(seed: Seed): Readonly<Record<string, ContractCase>> {
  const submit = {
    agent_id: "demo",
    conversation_id: "contract-c",
    actor: ACTOR,
    message_id: "contract-m-1",
    text: "contract",
    connector: "contract-matrix",
  };
  const live = { run_id: seed.liveRunId, actor: ACTOR, reason: "contract" };
  // The seed submits each message as `<conversation>-m` (see seedLedger in contract.test.ts).
  const seededMessage = { agent_id: "demo", conversation_id: "contract-seed-live", message_id: "contract-seed-live-m" };
  const settled = { run_id: seed.settledRunId, actor: ACTOR, reason: "contract" };

  return {
    // --- IngressService: connectors hand in messages and decisions.
    "keel.v1.IngressService/SubmitMessage": {
      role: "connector",
      // Idempotent on the message id: later calls get the same run back (duplicate), still OK.
      valid: submit,
      expect: "ok",
      check: (response) => void uuidField(response, "run_id"),
      invalid: [
        { request: { ...submit, agent_id: "" }, field: "agent_id" },
        { request: { ...submit, text: "   " }, field: "text" },
        { request: { ...submit, actor: { id: "" } }, field: "actor.id" },
        { request: { ...submit, connector: "Not A Slug" }, field: "connector" },
        // PostgreSQL text cannot hold NUL: refused up front, naming the field, not Internal.
        { request: { ...submit, text: "before\u0000after" }, field: "text" },
        { request: { ...submit, actor: { id: "nul\u0000actor" } }, field: "actor.id" },
      ],
      notFound: { ...submit, agent_id: "no-such-agent" },
    },
    "keel.v1.IngressService/EditMessage": {
      role: "connector",
      // The seeded live run's own message, edited by its author. The run has not started, so the
      // edit joins it; sending the same edit again changes nothing and names the same run.
      valid: { ...seededMessage, actor: ACTOR, text: "edited" },
      expect: "ok",
      check: expectField(seed.liveRunId, "run_id"),
      invalid: [
        { request: { ...seededMessage, actor: ACTOR, text: "" }, field: "text" },
        { request: { ...seededMessage, message_id: "has space", actor: ACTOR, text: "edited" }, field: "message_id" },
        { request: { ...seededMessage, actor: ACTOR, text: "edited\u0000" }, field: "text" },
      ],
      notFound: { ...seededMessage, message_id: "no-such-message", actor: ACTOR, text: "edited" },
    },
    "keel.v1.IngressService/AnswerInput": {
      role: "connector",
      // A queued run has asked nothing.
      valid: { run_id: seed.liveRunId, actor: ACTOR, text: "an answer" },
      expect: Code.FailedPrecondition,
      invalid: [
        { request: { run_id: "not-a-uuid", actor: ACTOR, text: "an answer" }, field: "run_id" },
        { request: { run_id: seed.liveRunId, actor: ACTOR, text: "" }, field: "text" },
      ],
      notFound: { run_id: MISSING_UUID, actor: ACTOR, text: "an answer" },
    },
    "keel.v1.IngressService/DecideGate": {
      role: "connector",
      // A loop-shaped run has no work graph, so no gate to decide.
      valid: { run_id: seed.liveRunId, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_APPROVE" },
      expect: Code.NotFound,
      invalid: [
        { request: { run_id: seed.liveRunId, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_UNSPECIFIED" }, field: "decision" },
        { request: { run_id: seed.liveRunId, gate_id: "", actor: ACTOR, decision: "GATE_DECISION_APPROVE" }, field: "gate_id" },
      ],
      notFound: { run_id: MISSING_UUID, gate_id: "gate-1", actor: ACTOR, decision: "GATE_DECISION_APPROVE" },
    },
    "keel.v1.IngressService/CancelRun": {
      role: "connector",
      // Cancelling the live run would not be repeatable; a settled run refuses, the same every time.
      valid: settled,
      expect: Code.FailedPrecondition,
      invalid: [{ request: { run_id: seed.liveRunId, reason: "no actor" }, field: "actor" }],
      notFound: { ...settled, run_id: MISSING_UUID },
    },
    "keel.v1.IngressService/ContinueRun": {
      role: "connector",
      // Only a run that ran out of budget can be continued; the seeded one was cancelled.
      valid: { run_id: seed.settledRunId, actor: ACTOR, text: "yes" },
      expect: Code.FailedPrecondition,
      invalid: [
        { request: { run_id: seed.settledRunId, actor: { id: "has space" }, text: "yes" }, field: "actor.id" },
        { request: { run_id: seed.settledRunId, actor: ACTOR, text: "" }, field: "text" },
      ],
      notFound: { run_id: MISSING_UUID, actor: ACTOR, text: "yes" },
    },

    // --- EmissionService: connectors receive what Keel says and report delivery.
    "keel.v1.EmissionService/Subscribe": {
      role: "connector",
      // The seeded connector already has emissions, so the stream's first message proves it opened.
      valid: { connector: seed.connector, after_seq: "0" },
      expect: "ok",
      check: expectField(seed.connector, "emission", "connector"),
      invalid: [{ request: { connector: "Not A Slug" }, field: "connector" }],
    },
    "keel.v1.EmissionService/AcknowledgeEmission": {
      role: "connector",
      // Acknowledging twice (once per client) is fine: the first outcome stands, the second reads it back.
      valid: { emission_id: seed.emissionId, outcome: "DELIVERY_STATUS_DELIVERED", remote_ref: "contract-ref" },
      expect: "ok",
      check: expectField("DELIVERY_STATUS_DELIVERED", "emission", "delivery_status"),
      invalid: [
        { request: { emission_id: "not-a-uuid", outcome: "DELIVERY_STATUS_DELIVERED" }, field: "emission_id" },
        { request: { emission_id: seed.emissionId, outcome: "DELIVERY_STATUS_PENDING" }, field: "outcome" },
      ],
      notFound: { emission_id: MISSING_UUID, outcome: "DELIVERY_STATUS_DELIVERED" },
    },

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

    // --- AgentService: admins define agents.
    "keel.v1.AgentService/PutAgent": {
      role: "admin",
      valid: { agent: { id: "contract-agent", display_name: "Contract", system_prompt: "Be brief." } },
      expect: "ok",
      check: expectField("contract-agent", "agent", "id"),
      invalid: [
        { request: {}, field: "agent" },
        { request: { agent: { id: "" } }, field: "agent.id" },
        { request: { agent: { id: "contract-agent", models: { primary: { provider: "nope" } } } }, field: "agent.models.primary.provider" },
      ],
    },
    "keel.v1.AgentService/GetAgent": {
      role: "admin",
      valid: { agent_id: "demo" },
      expect: "ok",
      check: expectField("demo", "agent", "id"),
      invalid: [{ request: { agent_id: "" }, field: "agent_id" }],
      notFound: { agent_id: "no-such-agent" },
    },
    "keel.v1.AgentService/ListAgents": {
      role: "admin",
      valid: { page_size: 10 },
      expect: "ok",
      check: expectArray("agents"),
      // A page token is opaque and page_size is clamped, so nothing here can be malformed;
      // the empty list records that on purpose rather than by omission.
      invalid: [],
    },
    "keel.v1.AgentService/GetInstallSettings": {
      role: "admin",
      valid: {},
      expect: "ok",
      check: expectField(64, "settings", "root_run_ceiling"),
      // The request has no fields.
      invalid: [],
    },
    "keel.v1.AgentService/PutInstallSettings": {
      role: "admin",
      // The default again, so the matrix's repeats change nothing the other cases see.
      valid: { root_run_ceiling: 64 },
      expect: "ok",
      check: expectField(64, "settings", "root_run_ceiling"),
      invalid: [
        { request: { root_run_ceiling: 0 }, field: "root_run_ceiling" },
        { request: { root_run_ceiling: 100_001 }, field: "root_run_ceiling" },
        { request: { retention_days: 36_501 }, field: "retention_days" },
      ],
    },

    // --- SandboxService: sandbox hosts attach over one bidi stream.
    "keel.v1.SandboxService/Attach": {
      role: "sandbox-host",
      // The stream's first answer is the registration's acknowledgement.
      valid: [{ register: { host_id: "contract-host", capacity: { workspaces: 1 }, agent_version: "contract" } }],
      expect: "ok",
      check: (response) => {
        expectField("contract-host", "registered", "host_id")(response);
        expectArray("registered", "reap_workspace_ids")(response);
      },
      invalid: [
        { request: [{ heartbeat: { free_workspaces: 1 } }], field: "register" },
        { request: [{ register: { host_id: "" } }], field: "register.host_id" },
        { request: [{ register: { host_id: "contract-host", capacity: { workspaces: 0 } } }], field: "register.capacity.workspaces" },
        { request: [{ register: { host_id: "contract-host", capacity: { workspaces: 1 }, running: [{ workspace_id: "" }] } }], field: "register.running[0].workspace_id" },
      ],
    },
  };
}

function uuidField(response: JsonObject, name: string): string {
  const value = response[name];
  if (typeof value !== "string" || !/^[0-9a-f-]{36}$/.test(value)) throw new Error(`response.${name}: expected a UUID, got ${JSON.stringify(value)}`);
  return value;
}
