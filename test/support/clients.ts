import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import type { DescService } from "@bufbuild/protobuf";

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
