// The standard gRPC health service, asked the way a load balancer would: @grpc/grpc-js loading
// the health .proto at run time, no token. SERVING while the database answers; NOT_SERVING
// while it is cut (through a TCP relay) and while the server drains; Watch reports each change.
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "./support/child-processes.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { TcpRelay } from "./support/tcp-relay.js";

interface HealthClient extends grpc.Client {
  check(request: { service: string }, callback: (error: grpc.ServiceError | null, response?: { status: string }) => void): void;
  watch(request: { service: string }): grpc.ClientReadableStream<{ status: string }>;
}

let keel: TestKeel;
let relay: TcpRelay;
let health: HealthClient;

beforeAll(async () => {
  const direct = await createTestDatabase();
  relay = TcpRelay.toDatabase(direct);
  await relay.open();
  keel = await startTestKeel({ databaseUrl: relay.relayed(direct), workers: 0 });
  const definition = protoLoader.loadSync(path.join(ROOT, "proto-vendor", "grpc", "health", "v1", "health.proto"), { enums: String });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    grpc: { health: { v1: { Health: new (address: string, credentials: grpc.ChannelCredentials) => HealthClient } } };
  };
  health = new loaded.grpc.health.v1.Health(keel.url.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
}, 60_000);

afterAll(async () => {
  health?.close();
  await relay.open();
  await keel?.stop();
  await relay.cut();
});

const check = (service: string): Promise<{ status?: string; code?: grpc.status }> =>
  new Promise((resolve) => health.check({ service }, (error, response) => resolve(error === null ? { status: response?.status ?? "" } : { code: error.code })));

/** The next message of a Watch stream, within a deadline. */
function nextStatus(stream: grpc.ClientReadableStream<{ status: string }>, timeoutMs = 5_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no health status within the deadline")), timeoutMs);
    stream.once("data", (message: { status: string }) => {
      clearTimeout(timer);
      resolve(message.status);
    });
  });
}

describe("grpc.health.v1.Health", () => {
  it("answers Check without a token: the server and each Keel service, NotFound for others", async () => {
    expect(await check("")).toEqual({ status: "SERVING" });
    expect(await check("keel.v1.IngressService")).toEqual({ status: "SERVING" });
    expect(await check("no.such.Service")).toEqual({ code: grpc.status.NOT_FOUND });
  });

  it("reports NOT_SERVING while the database is cut, in Check and in Watch, and SERVING once it is back", async () => {
    const stream = health.watch({ service: "" });
    stream.on("error", () => {});
    expect(await nextStatus(stream)).toBe("SERVING");
    await relay.cut();
    expect(await nextStatus(stream)).toBe("NOT_SERVING");
    expect(await check("")).toEqual({ status: "NOT_SERVING" });
    await relay.open();
    expect(await nextStatus(stream)).toBe("SERVING");
    stream.cancel();
  }, 30_000);

  it("tells a Watch of an unknown service SERVICE_UNKNOWN", async () => {
    const stream = health.watch({ service: "no.such.Service" });
    stream.on("error", () => {});
    expect(await nextStatus(stream)).toBe("SERVICE_UNKNOWN");
  });
});
