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
import { ACTOR, expectArray, expectField, MISSING_UUID, type ContractCase, type Seed } from "./contract-case-kit.js";
import { runServiceCases } from "./contract-cases-run.js";

/** Every service of the public contract; the suite walks their descriptors. */
export const CONTRACT_SERVICES: readonly DescService[] = [IngressService, EmissionService, RunService, AgentService, SandboxService];

export const ROLES: readonly TokenRole[] = ["connector", "sandbox-host", "operator", "admin"];

/** "keel.v1.IngressService/SubmitMessage": the gRPC path without the leading slash. */
export const methodKey = (method: DescMethod): string => `${method.parent.typeName}/${method.name}`;

export const allMethods = (): DescMethod[] => CONTRACT_SERVICES.flatMap((service) => service.methods);

export * from "./contract-case-kit.js";

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
    "keel.v1.EmissionService/AcknowledgeEmissions": {
      role: "connector",
      valid: { acknowledgements: [{ emission_id: seed.emissionId, outcome: "DELIVERY_STATUS_DELIVERED", remote_ref: "contract-ref" }] },
      expect: "ok",
      check: expectField("DELIVERY_STATUS_DELIVERED", "emissions", "0", "delivery_status"),
      invalid: [
        { request: { acknowledgements: [] }, field: "acknowledgements" },
        { request: { acknowledgements: [{ emission_id: "not-a-uuid", outcome: "DELIVERY_STATUS_DELIVERED" }] }, field: "acknowledgements[0].emission_id" },
        {
          request: {
            acknowledgements: [
              { emission_id: seed.emissionId, outcome: "DELIVERY_STATUS_DELIVERED" },
              { emission_id: seed.emissionId, outcome: "DELIVERY_STATUS_PENDING" },
            ],
          },
          field: "acknowledgements[1].outcome",
        },
      ],
      notFound: { acknowledgements: [{ emission_id: MISSING_UUID, outcome: "DELIVERY_STATUS_DELIVERED" }] },
    },

    ...runServiceCases(seed),

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
      // page_size is clamped; a page token the ledger did not issue is refused, never read as
      // "from the start" (base64url skips the characters it does not know, and this one would
      // decode to a NUL, which PostgreSQL refused as Internal).
      invalid: [
        { request: { page_size: 10, page_token: "A>C.pD" }, field: "page_token" },
        { request: { page_size: 10, page_token: "AA" }, field: "page_token" },
      ],
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
