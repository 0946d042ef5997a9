import { execFile } from "node:child_process";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { create, fromBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import { connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { registerReflection } from "../control-plane/src/api/reflection-service.js";
import * as v1 from "../gen/grpc/reflection/v1/reflection_pb.js";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { SandboxService } from "../gen/keel/v1/sandbox_service_pb.js";

const run = promisify(execFile);
const buf = fileURLToPath(new URL("../node_modules/.bin/buf", import.meta.url));
const grpcFlags = ["curl", "--protocol", "grpc", "--http2-prior-knowledge"];

let server: http2.Http2Server;
let baseUrl = "";
// The gRPC client transport keeps its HTTP/2 session open for reuse, which
// would hold server.close() open until the session times out.
const sessions = new Set<http2.ServerHttp2Session>();

beforeAll(async () => {
  server = http2.createServer(
    connectNodeAdapter({
      routes: (router) => {
        registerReflection(router, [IngressService, RunService, AgentService, EmissionService, SandboxService]);
        router.service(AgentService, {
          getAgent: (req) => ({ agent: { id: req.agentId, displayName: "x" } }),
        });
      },
    }),
  );
  server.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  sessions.forEach((session) => session.destroy());
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

function ask(
  messageRequest: NonNullable<MessageInitShape<typeof v1.ServerReflectionRequestSchema>["messageRequest"]>,
): v1.ServerReflectionRequest {
  return create(v1.ServerReflectionRequestSchema, { messageRequest });
}

async function reflect(...requests: v1.ServerReflectionRequest[]): Promise<v1.ServerReflectionResponse[]> {
  const client = createClient(v1.ServerReflection, createGrpcTransport({ baseUrl }));
  const responses: v1.ServerReflectionResponse[] = [];
  for await (const response of client.serverReflectionInfo(createAsyncIterable(requests))) {
    responses.push(response);
  }
  return responses;
}

describe("gRPC server reflection", () => {
  it("lets buf curl list every Keel method", async () => {
    const { stdout } = await run(buf, [...grpcFlags, "--list-methods", baseUrl]);
    for (const method of [
      "keel.v1.IngressService/SubmitMessage",
      "keel.v1.RunService/",
      "keel.v1.AgentService/GetAgent",
      "keel.v1.EmissionService/",
      "keel.v1.SandboxService/Attach",
    ]) {
      expect(stdout).toContain(method);
    }
  });

  it("lets buf curl call a method using the reflected schema", async () => {
    const { stdout } = await run(buf, [
      ...grpcFlags,
      "-d",
      '{"agent_id":"a1"}',
      `${baseUrl}/keel.v1.AgentService/GetAgent`,
    ]);
    expect(JSON.parse(stdout)).toMatchObject({ agent: { id: "a1", displayName: "x" } });
  });

  it("serves the v1alpha protocol too", async () => {
    const v1alpha = ["--reflect-protocol", "grpc-v1alpha"];
    const { stdout: methods } = await run(buf, [...grpcFlags, ...v1alpha, "--list-methods", baseUrl]);
    expect(methods).toContain("keel.v1.SandboxService/Attach");
    const { stdout } = await run(buf, [
      ...grpcFlags,
      ...v1alpha,
      "-d",
      '{"agent_id":"a2"}',
      `${baseUrl}/keel.v1.AgentService/GetAgent`,
    ]);
    expect(JSON.parse(stdout)).toMatchObject({ agent: { id: "a2" } });
  });

  it("lists the given services and reflection itself", async () => {
    const [response] = await reflect(ask({ case: "listServices", value: "" }));
    expect(response?.messageResponse.case).toBe("listServicesResponse");
    const names =
      response?.messageResponse.case === "listServicesResponse"
        ? response.messageResponse.value.service.map((s) => s.name)
        : [];
    expect(names).toEqual(
      expect.arrayContaining([
        "keel.v1.IngressService",
        "keel.v1.SandboxService",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
      ]),
    );
  });

  it("returns a method's file with its transitive imports, and echoes the request", async () => {
    const request = create(v1.ServerReflectionRequestSchema, {
      host: "keel.test",
      messageRequest: { case: "fileContainingSymbol", value: "keel.v1.IngressService.SubmitMessage" },
    });
    const [response] = await reflect(request);
    expect(response?.validHost).toBe("keel.test");
    expect(response?.originalRequest).toEqual(request);
    expect(response?.messageResponse.case).toBe("fileDescriptorResponse");
    const files =
      response?.messageResponse.case === "fileDescriptorResponse"
        ? response.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b).name)
        : [];
    expect(files[0]).toBe("keel/v1/ingress_service.proto");
    expect(files).toEqual(expect.arrayContaining(["keel/v1/run.proto", "keel/v1/work_graph.proto"]));
  });

  it("answers unknown symbols, files and extensions with NOT_FOUND on the same stream", async () => {
    const responses = await reflect(
      ask({ case: "fileContainingSymbol", value: "keel.v1.Nope" }),
      ask({ case: "fileByFilename", value: "nope.proto" }),
      ask({ case: "fileContainingExtension", value: { containingType: "keel.v1.AgentSpec", extensionNumber: 100 } }),
      ask({ case: "allExtensionNumbersOfType", value: "keel.v1.Nope" }),
    );
    expect(responses).toHaveLength(4);
    for (const response of responses) {
      expect(response.messageResponse.case).toBe("errorResponse");
      expect(response.messageResponse.value).toMatchObject({ errorCode: 5 });
    }
    const first = responses[0]?.messageResponse;
    expect(first?.case === "errorResponse" ? first.value.errorMessage : "").toContain("keel.v1.Nope");
  });

  it("reports no extension numbers for a known message", async () => {
    const [response] = await reflect(ask({ case: "allExtensionNumbersOfType", value: "keel.v1.AgentSpec" }));
    expect(response?.messageResponse).toMatchObject({
      case: "allExtensionNumbersResponse",
      value: { baseTypeName: "keel.v1.AgentSpec", extensionNumber: [] },
    });
  });
});
