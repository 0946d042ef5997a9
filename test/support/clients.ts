import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import type { DescService } from "@bufbuild/protobuf";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

/** A Connect-protocol client (HTTP/2) with a bearer token. */
export function connectClient<T extends DescService>(service: T, baseUrl: string, token?: string): Client<T> {
  return createClient(service, createConnectTransport({ baseUrl, httpVersion: "2", interceptors: bearer(token) }));
}

/** A gRPC-protocol client from connect-node. */
export function grpcClient<T extends DescService>(service: T, baseUrl: string, token?: string): Client<T> {
  return createClient(service, createGrpcTransport({ baseUrl, interceptors: bearer(token) }));
}

function bearer(token: string | undefined): Interceptor[] {
  if (token === undefined) return [];
  return [
    (next) => (request) => {
      request.header.set("authorization", `Bearer ${token}`);
      return next(request);
    },
  ];
}

/**
 * A @grpc/grpc-js client of one Keel service, loaded from the .proto files as a client in another
 * language would be (snake_case fields, 64-bit integers and enums as strings), over plaintext.
 */
export async function grpcJsClient(baseUrl: string, file: string, service: string): Promise<grpc.Client> {
  const definition = await protoLoader.load([`keel/v1/${file}`], {
    includeDirs: [fileURLToPath(new URL("../../proto", import.meta.url))],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  const v1 = (grpc.loadPackageDefinition(definition)["keel"] as grpc.GrpcObject)["v1"] as grpc.GrpcObject;
  const Service = v1[service] as grpc.ServiceClientConstructor;
  return new Service(baseUrl.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
}

/** grpc-js metadata carrying a bearer token. */
export function grpcJsBearer(token: string): grpc.Metadata {
  const metadata = new grpc.Metadata();
  metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}
