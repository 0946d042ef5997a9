// The contract suite, generated from the proto descriptors.
//
// Every RPC of every keel.v1 service must have a case in support/contract-cases.ts, and
// every case runs through two unrelated clients over the real server on loopback:
//   - @grpc/grpc-js + @grpc/proto-loader, given nothing but the .proto files, as a client
//     written in another language would be;
//   - the Connect-ES client generated from the same protos (Connect protocol, HTTP/2).
// Each checks the same promises: no token → Unauthenticated; a wrong role → PermissionDenied;
// bad input → InvalidArgument naming the proto field; the valid request → the expected outcome.
import { raw, sql } from "../control-plane/src/ledger/sql.js";
import { readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { fromJson, toJson, type DescMethod, type DescService, type JsonObject, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError, type CallOptions, type Client } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { connectClient } from "./support/clients.js";
import {
  allMethods,
  CONTRACT_SERVICES,
  contractCases,
  methodKey,
  ROLES,
  type ContractCase,
  type Expected,
  type RpcInput,
  type Seed,
} from "./support/contract-cases.js";
import { seedContractLedger } from "./support/contract-seed.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const PROTO_ROOT = fileURLToPath(new URL("../proto", import.meta.url));
const CALL_TIMEOUT_MS = 15_000;

/** How a call ended, in one shape for both clients. gRPC status numbers and Connect codes are the same numbers; 0 is OK. */
interface Outcome {
  readonly code: number;
  readonly message: string;
  /** The unary response, or the first message of a stream; snake_case field names either way. */
  readonly response?: JsonObject;
}

interface ContractClient {
  readonly name: string;
  call(method: DescMethod, input: RpcInput, token: string | undefined): Promise<Outcome>;
  close(): void;
}

const GRPC_JS = "grpc-js (from .proto)";
const CONNECT_ES = "Connect-ES";

const codeName = (code: number): string => (code === 0 ? "OK" : (Code[code] ?? `code ${code}`));
const messagesOf = (input: RpcInput): readonly JsonObject[] => (Array.isArray(input) ? (input as readonly JsonObject[]) : [input as JsonObject]);
/** Validation messages start with the proto field's name: "run_id: must be a UUID". */
const namesFieldFirst = (field: string): RegExp => new RegExp(`^${field.replace(/[.[\]]/g, "\\$&")}: `);
const ok = (response?: JsonObject): Outcome => (response === undefined ? { code: 0, message: "" } : { code: 0, message: "", response });

// ---------------------------------------------------------------------------------------
// Client (a): @grpc/grpc-js, loading the .proto files at run time.

interface ForeignApi {
  readonly definition: protoLoader.PackageDefinition;
  stub(typeName: string): { client: grpc.Client; methods: grpc.ServiceDefinition };
}

async function loadForeignApi(address: string): Promise<ForeignApi & { close(): void }> {
  const files = (await readdir(path.join(PROTO_ROOT, "keel/v1"))).filter((f) => f.endsWith(".proto")).map((f) => `keel/v1/${f}`);
  const definition = await protoLoader.load(files, {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const root = grpc.loadPackageDefinition(definition);
  const stubs = new Map<string, { client: grpc.Client; methods: grpc.ServiceDefinition }>();
  return {
    definition,
    stub(typeName) {
      let stub = stubs.get(typeName);
      if (stub === undefined) {
        // pkg.keel.v1.IngressService, reached by walking the dotted name.
        const ctor = typeName.split(".").reduce<unknown>((node, part) => (node as grpc.GrpcObject | undefined)?.[part], root);
        if (typeof ctor !== "function") throw new Error(`${typeName} is not a service in the .proto files`);
        const Service = ctor as grpc.ServiceClientConstructor;
        stub = { client: new Service(address, grpc.credentials.createInsecure()), methods: Service.service };
        stubs.set(typeName, stub);
      }
      return stub;
    },
    close() {
      for (const { client } of stubs.values()) client.close();
    },
  };
}

function grpcMetadata(token: string | undefined): grpc.Metadata {
  const metadata = new grpc.Metadata();
  if (token !== undefined) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

/**
 * Connect-ES percent-encodes grpc-message with encodeURIComponent (":" becomes "%3A"), and
 * grpc-js undoes it with decodeURI, which leaves reserved characters encoded: a grpc-js caller
 * reads "run_id%3A must be a UUID". The gRPC spec says receivers percent-decode, as grpc-go and
 * grpc-java do, so this client decodes the rest itself; the code is untouched either way.
 */
function fullyDecoded(details: string): string {
  try {
    return decodeURIComponent(details);
  } catch {
    return details;
  }
}

const fromServiceError = (error: grpc.ServiceError): Outcome => ({ code: error.code, message: fullyDecoded(error.details) });

function grpcJsClient(api: ForeignApi & { close(): void }): ContractClient {
  return {
    name: GRPC_JS,
    call(method, input, token) {
      const { client, methods } = api.stub(method.parent.typeName);
      const def = methods[method.name] as grpc.MethodDefinition<JsonObject, JsonObject> | undefined;
      if (def === undefined) return Promise.resolve({ code: Code.Unimplemented, message: `${methodKey(method)} is not in the .proto files` });
      const metadata = grpcMetadata(token);
      const options = { deadline: Date.now() + CALL_TIMEOUT_MS };
      return new Promise<Outcome>((resolve) => {
        if (method.methodKind === "unary") {
          client.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, input as JsonObject, metadata, options, (error, value) =>
            resolve(error !== null ? fromServiceError(error) : ok(value)),
          );
          return;
        }
        if (method.methodKind === "client_streaming") {
          const call = client.makeClientStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, metadata, options, (error, value) =>
            resolve(error !== null ? fromServiceError(error) : ok(value)),
          );
          for (const message of messagesOf(input)) call.write(message);
          call.end();
          return;
        }
        // Response streams: the first message (or a clean end) is the outcome; then we hang up.
        let call: grpc.ClientReadableStream<JsonObject>;
        if (method.methodKind === "server_streaming") {
          call = client.makeServerStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, input as JsonObject, metadata, options);
        } else {
          const duplex = client.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, metadata, options);
          for (const message of messagesOf(input)) duplex.write(message);
          duplex.end();
          call = duplex;
        }
        let settled = false;
        const finish = (outcome: Outcome) => {
          if (settled) return;
          settled = true;
          resolve(outcome);
          call.cancel();
        };
        call.on("data", (message: JsonObject) => finish(ok(message)));
        call.on("error", (error: grpc.ServiceError) => finish(fromServiceError(error)));
        // 'end' follows any buffered 'data', so a stream that did speak has already settled.
        call.on("end", () => finish(ok()));
      });
    },
    close: () => api.close(),
  };
}

// ---------------------------------------------------------------------------------------
// Client (b): the generated Connect-ES client, called by the method's local name.

/** A generated client method; what it returns depends on the method kind. */
type AnyRpc = (input: unknown, options: CallOptions) => unknown;

function connectEsClient(baseUrl: () => string): ContractClient {
  const clients = new Map<string, Client<DescService>>();
  const clientFor = (service: DescService, token: string | undefined) => {
    const key = `${service.typeName} ${token ?? ""}`;
    let client = clients.get(key);
    if (client === undefined) {
      client = connectClient(service, baseUrl(), token);
      clients.set(key, client);
    }
    return client as unknown as Record<string, AnyRpc>;
  };
  const outputJson = (method: DescMethod, message: Message): JsonObject =>
    toJson(method.output, message, { useProtoFieldName: true, alwaysEmitImplicit: true }) as JsonObject;

  return {
    name: CONNECT_ES,
    async call(method, input, token) {
      const rpc = clientFor(method.parent, token)[method.localName];
      if (rpc === undefined) return { code: Code.Unimplemented, message: `${methodKey(method)} is not on the generated client` };
      const abort = new AbortController();
      const options: CallOptions = { signal: abort.signal, timeoutMs: CALL_TIMEOUT_MS };
      const unary = (request: unknown) => rpc(request, options) as Promise<Message>;
      const stream = (request: unknown) => rpc(request, options) as AsyncIterable<Message>;
      try {
        switch (method.methodKind) {
          case "unary":
            return ok(outputJson(method, await unary(fromJson(method.input, input as JsonObject))));
          case "server_streaming":
            for await (const message of stream(fromJson(method.input, input as JsonObject))) return ok(outputJson(method, message));
            return ok();
          case "client_streaming":
          case "bidi_streaming": {
            const requests = createAsyncIterable(messagesOf(input).map((message) => fromJson(method.input, message)));
            if (method.methodKind === "client_streaming") return ok(outputJson(method, await unary(requests)));
            for await (const message of stream(requests)) return ok(outputJson(method, message));
            return ok();
          }
        }
      } catch (error) {
        const connectError = ConnectError.from(error);
        return { code: connectError.code, message: connectError.rawMessage };
      } finally {
        abort.abort(); // hang up on a stream we stopped reading
      }
    },
    close: () => clients.clear(),
  };
}

// ---------------------------------------------------------------------------------------

let keel: TestKeel;
let foreign: ForeignApi;
let seed: Seed;
let cases: Readonly<Record<string, ContractCase>>;
const clients: ContractClient[] = [];

beforeAll(async () => {
  // No workers: every run the cases point at stays exactly where the seed left it.
  keel = await startTestKeel({ workers: 0 });
  const grpcJsApi = await loadForeignApi(keel.url.replace(/^http:\/\//, "")); // grpc-js wants host:port
  foreign = grpcJsApi;
  clients.push(grpcJsClient(grpcJsApi), connectEsClient(() => keel.url));
  seed = await seedContractLedger(keel);
  cases = contractCases(seed);
});

afterAll(async () => {
  // Idle client sessions are closed first so the server's close() does not wait on them.
  for (const client of clients) client.close();
  await keel?.stop();
});

// The table's keys do not depend on the seed; these tests need no server.
const PLACEHOLDER_SEED: Seed = { liveRunId: "", settledRunId: "", emissionId: "", connector: "" };

describe("coverage: every RPC in the descriptors has a contract case", () => {
  it("has a case for every method of every keel.v1 service", () => {
    const keys = new Set(Object.keys(contractCases(PLACEHOLDER_SEED)));
    const missing = allMethods()
      .map(methodKey)
      .filter((key) => !keys.has(key));
    expect(missing, "RPCs without a contract case in test/support/contract-cases.ts").toEqual([]);
  });

  it("has no case for a method that does not exist", () => {
    const known = new Set(allMethods().map(methodKey));
    const stale = Object.keys(contractCases(PLACEHOLDER_SEED)).filter((key) => !known.has(key));
    expect(stale, "contract cases naming no RPC").toEqual([]);
  });

  it("walks all five services", () => {
    expect(CONTRACT_SERVICES.map((s) => s.typeName).sort()).toEqual(
      ["keel.v1.AgentService", "keel.v1.EmissionService", "keel.v1.IngressService", "keel.v1.RunService", "keel.v1.SandboxService"].sort(),
    );
  });

  it("the .proto files and the generated descriptors describe the same RPCs", () => {
    // A stale gen/ would let the TypeScript side pass while foreign clients see another contract.
    const fromProto = Object.entries(foreign.definition)
      .filter(([name, def]) => name.startsWith("keel.v1.") && !("format" in def))
      .flatMap(([name, def]) =>
        Object.entries(def as grpc.ServiceDefinition).map(([method, m]) => `${name}/${method} ${String(m.requestStream)}/${String(m.responseStream)}`),
      )
      .sort();
    const fromGen = allMethods()
      .map((m) => `${methodKey(m)} ${String(m.methodKind === "client_streaming" || m.methodKind === "bidi_streaming")}/${String(m.methodKind === "server_streaming" || m.methodKind === "bidi_streaming")}`)
      .sort();
    expect(fromProto).toEqual(fromGen);
  });
});

for (const clientName of [GRPC_JS, CONNECT_ES]) {
  describe(`contract over ${clientName}`, () => {
    for (const method of allMethods()) {
      it(`${methodKey(method)} (${method.methodKind})`, async () => {
        const client = clients.find((c) => c.name === clientName)!;
        const contract = cases[methodKey(method)];
        if (contract === undefined) throw new Error(`no contract case for ${methodKey(method)}`);
        await checkContract(client, method, contract);
      });
    }
  });
}

/** The one generic runner: the same promises for every RPC, asserted through one client. */
async function checkContract(client: ContractClient, method: DescMethod, contract: ContractCase): Promise<void> {
  const expectCode = (outcome: Outcome, expected: Expected, what: string) =>
    expect(codeName(outcome.code), `${what}; server said: ${outcome.message}`).toBe(expected === "ok" ? "OK" : codeName(expected));

  // Authentication comes before anything else, including validation.
  expectCode(await client.call(method, contract.valid, undefined), Code.Unauthenticated, "no token");
  expectCode(await client.call(method, contract.valid, "keel_bogus"), Code.Unauthenticated, "unknown token");

  for (const role of ROLES.filter((r) => r !== contract.role && r !== "admin")) {
    expectCode(await client.call(method, contract.valid, keel.tokens[role]), Code.PermissionDenied, `role ${role}`);
  }

  for (const { request, field } of contract.invalid) {
    const outcome = await client.call(method, request, keel.tokens[contract.role]);
    expectCode(outcome, Code.InvalidArgument, `bad ${field}`);
    expect(outcome.message, "InvalidArgument names the proto field first").toMatch(namesFieldFirst(field));
  }

  if (contract.notFound !== undefined) {
    expectCode(await client.call(method, contract.notFound, keel.tokens[contract.role]), Code.NotFound, "an id that does not exist");
  }

  // The right role, then admin (who may call everything), get the same answer.
  for (const role of new Set([contract.role, "admin" as const])) {
    const outcome = await client.call(method, contract.valid, keel.tokens[role]);
    expectCode(outcome, contract.expect, `valid request as ${role}`);
    if (contract.expect === Code.Unimplemented) expect(outcome.message).toMatch(/not implemented yet/);
    if (contract.expect === "ok" && contract.check !== undefined) {
      expect(outcome.response, "the valid request answered with a message").toBeDefined();
      contract.check(outcome.response!);
    }
  }
}

// ---------------------------------------------------------------------------------------

type UnaryStub = (request: JsonObject, metadata: grpc.Metadata, callback: (error: grpc.ServiceError | null, value?: JsonObject) => void) => grpc.ClientUnaryCall;
type StreamStub = (request: JsonObject, metadata: grpc.Metadata) => grpc.ClientReadableStream<JsonObject>;

describe("a client given only the .proto files", () => {
  // Its own Keel, with workers, so the demo agent actually replies.
  let working: TestKeel;
  let api: Awaited<ReturnType<typeof loadForeignApi>>;
  beforeAll(async () => {
    working = await startTestKeel();
    api = await loadForeignApi(working.url.replace(/^http:\/\//, "")); // grpc-js wants host:port
  });
  afterAll(async () => {
    api?.close();
    await working?.stop();
  });

  it("submits a message, receives the reply on Subscribe and acknowledges it", async () => {
    const connector = "grpcjs-e2e";
    const text = "hello over grpc-js";
    const metadata = grpcMetadata(working.tokens.connector);
    // The idiomatic grpc-js surface: methods named as in the .proto, added at load time.
    const ingress = api.stub("keel.v1.IngressService").client as unknown as { SubmitMessage: UnaryStub };
    const emissions = api.stub("keel.v1.EmissionService").client as unknown as { Subscribe: StreamStub; AcknowledgeEmission: UnaryStub };
    const unary = (stub: UnaryStub, request: JsonObject) =>
      new Promise<JsonObject>((resolve, reject) =>
        stub(request, metadata, (error, value) => (error === null && value !== undefined ? resolve(value) : reject(error ?? new Error("no response")))),
      );

    // Subscribe first: the stream replays from after_seq 0 anyway, but live delivery is what a connector relies on.
    const stream = emissions.Subscribe({ connector, after_seq: "0" }, metadata);
    const reply = new Promise<JsonObject>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no reply emission within 20 s")), 20_000);
      stream.on("data", (message: JsonObject) => {
        const emission = message["emission"] as JsonObject | undefined;
        if (emission?.["kind"] === "EMISSION_KIND_REPLY") {
          clearTimeout(timer);
          resolve(emission);
        }
      });
      stream.on("error", (error: grpc.ServiceError) => {
        clearTimeout(timer);
        if (error.code !== grpc.status.CANCELLED) reject(error);
      });
    });

    const submitted = await unary(ingress.SubmitMessage.bind(ingress), {
      agent_id: "demo",
      conversation_id: "grpcjs-c",
      actor: { id: "grpcjs-user" },
      message_id: "grpcjs-m-1",
      text,
      connector,
    });
    expect(submitted["status"]).toBe("RUN_STATUS_QUEUED");
    expect(submitted["duplicate"]).toBe(false);

    const emission = await reply.finally(() => stream.cancel());
    expect(emission["text"]).toBe(`Hello from Keel. You said: ${text}`);
    expect(emission["run_id"]).toBe(submitted["run_id"]);
    expect(emission["connector"]).toBe(connector);
    expect(emission["delivery_status"]).toBe("DELIVERY_STATUS_PENDING");

    const acked = await unary(emissions.AcknowledgeEmission.bind(emissions), {
      emission_id: emission["id"]!,
      outcome: "DELIVERY_STATUS_DELIVERED",
      remote_ref: "grpcjs-ref-1",
    });
    expect(acked["emission"]).toMatchObject({ id: emission["id"], delivery_status: "DELIVERY_STATUS_DELIVERED", remote_ref: "grpcjs-ref-1" });
  });
});

describe("bad inputs are refused with the right code and leave no trace", () => {
  const submit = (messageId: string, patch: JsonObject = {}): JsonObject => ({
    agent_id: "demo",
    conversation_id: "bad-inputs",
    actor: { id: "mallory" },
    message_id: messageId,
    text: "fine",
    connector: "bad-inputs",
    ...patch,
  });
  const submitMethod = IngressService.method.submitMessage;
  const getRun = RunService.method.getRun;
  type Token = (tokens: TestKeel["tokens"]) => string | undefined;
  const BAD_INPUTS: readonly { name: string; method: DescMethod; request: JsonObject; token: Token; code: Code; field?: string }[] = [
    { name: "empty text", method: submitMethod, request: submit("bad-1", { text: "" }), token: (t) => t.connector, code: Code.InvalidArgument, field: "text" },
    { name: "unknown agent", method: submitMethod, request: submit("bad-2", { agent_id: "no-such-agent" }), token: (t) => t.connector, code: Code.NotFound },
    // Over KEEL_MAX_MESSAGE_BYTES (4 MiB): refused by the framework before any handler runs.
    {
      name: "a 10 MB message",
      method: submitMethod,
      request: submit("bad-3", { text: "x".repeat(10 * 1024 * 1024) }),
      token: (t) => t.connector,
      code: Code.ResourceExhausted,
    },
    // Under the message limit but over KEEL_MAX_TEXT_BYTES (256 KiB): refused by the handler, naming the field.
    {
      name: "text over the text limit",
      method: submitMethod,
      request: submit("bad-4", { text: "x".repeat(300 * 1024) }),
      token: (t) => t.connector,
      code: Code.ResourceExhausted,
      field: "text",
    },
    { name: "malformed run id", method: getRun, request: { run_id: "not-a-uuid" }, token: (t) => t.operator, code: Code.InvalidArgument, field: "run_id" },
    { name: "missing token", method: submitMethod, request: submit("bad-5"), token: () => undefined, code: Code.Unauthenticated },
    { name: "wrong token", method: submitMethod, request: submit("bad-6"), token: () => "keel_bogus", code: Code.Unauthenticated },
    { name: "token of another role", method: submitMethod, request: submit("bad-7"), token: (t) => t.operator, code: Code.PermissionDenied },
  ];

  const count = async (table: "runs" | "messages"): Promise<number> => {
    const [row] = await keel.app.ledger.sql.query<{ n: number }>(sql`select count(*)::int as n from ${raw(table)}`);
    return row!.n;
  };

  for (const clientName of [GRPC_JS, CONNECT_ES]) {
    it(`over ${clientName}`, async () => {
      const client = clients.find((c) => c.name === clientName)!;
      const before = { runs: await count("runs"), messages: await count("messages") };

      for (const bad of BAD_INPUTS) {
        const outcome = await client.call(bad.method, bad.request, bad.token(keel.tokens));
        expect(codeName(outcome.code), `${bad.name}; server said: ${outcome.message}`).toBe(codeName(bad.code));
        if (bad.field !== undefined) expect(outcome.message, bad.name).toMatch(namesFieldFirst(bad.field));
      }
      expect({ runs: await count("runs"), messages: await count("messages") }, "rejected requests created nothing").toEqual(before);

      // The server (and this client's connection) keeps serving after all of that.
      const accepted = await client.call(submitMethod, submit(`good-${clients.indexOf(client)}`, { text: "still here?" }), keel.tokens.connector);
      expect(codeName(accepted.code), accepted.message).toBe("OK");
      expect(accepted.response?.["duplicate"]).toBe(false);
      expect({ runs: await count("runs"), messages: await count("messages") }).toEqual({ runs: before.runs + 1, messages: before.messages + 1 });
    });
  }
});

describe("ListRuns page tokens", () => {
  // The server refuses tokens it did not issue (InvalidArgument, in the matrix); the ones it issues must still work.
  it("accepts the token it handed out and pages through every run once", async () => {
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const seen: string[] = [];
    let pageToken = "";
    do {
      const page = await runs.listRuns({ pageSize: 1, pageToken });
      seen.push(...page.runs.map((r) => r.id));
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    expect(seen.length).toBeGreaterThanOrEqual(2);
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen).toEqual(expect.arrayContaining([seed.liveRunId, seed.settledRunId]));
  });
});

describe("Connect JSON over the HTTP/1.1 listener", () => {
  it("answers ListRuns to a plain fetch", async () => {
    const response = await fetch(`${keel.http1Url}/keel.v1.RunService/ListRuns`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${keel.tokens.operator}` },
      body: "{}",
    });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^application\/json/);
    const body = (await response.json()) as { runs?: { id: string }[] };
    expect(Array.isArray(body.runs)).toBe(true);
    expect(body.runs?.map((r) => r.id)).toContain(seed.liveRunId);
  });

  it("maps errors to Connect JSON errors with the HTTP status the protocol prescribes", async () => {
    const unauthenticated = await fetch(`${keel.http1Url}/keel.v1.RunService/ListRuns`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(unauthenticated.status).toBe(401);
    expect(await unauthenticated.json()).toMatchObject({ code: "unauthenticated" });

    const invalid = await fetch(`${keel.http1Url}/keel.v1.RunService/GetRun`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${keel.tokens.operator}` },
      body: JSON.stringify({ runId: "not-a-uuid" }),
    });
    expect(invalid.status).toBe(400);
    expect(await invalid.json()).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/^run_id: /) as unknown });
  });
});
