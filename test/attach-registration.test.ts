// Issue #12 item 12: Attach waits for a host's registration a bounded time (a silent stream is
// ended with InvalidArgument on register), and every registration field is bounded, a refusal
// naming the field. Real server, real PostgreSQL, a Connect gRPC client over HTTP/2.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AttachRequestSchema, SandboxService, type AttachRequest } from "../gen/keel/v1/sandbox_service_pb.js";
import { CONTRACT_HOST_ID, startTestKeel, type TestKeel } from "./support/keel-fixture.js";

let keel: TestKeel;
beforeAll(async () => {
  keel = await startTestKeel({ workers: 0, env: { KEEL_SANDBOX_REGISTRATION_WAIT_MS: "300" } });
});
afterAll(async () => {
  await keel?.stop();
});

/** Opens Attach, sends `first` (if any), keeps the request side open, and returns how the stream ended. */
async function attachWith(first: AttachRequest | undefined): Promise<{ error: ConnectError | undefined; ms: number }> {
  const client = createClient(
    SandboxService,
    createGrpcTransport({
      baseUrl: keel.url,
      interceptors: [(next) => (request) => (request.header.set("authorization", `Bearer ${keel.tokens["sandbox-host"]}`), next(request))],
    }),
  );
  const hangUp = new AbortController();
  async function* requests(): AsyncGenerator<AttachRequest> {
    if (first !== undefined) yield first;
    await new Promise((resolve) => hangUp.signal.addEventListener("abort", resolve));
  }
  const started = Date.now();
  const timeout = setTimeout(() => hangUp.abort(), 5_000);
  try {
    for await (const response of client.attach(requests(), { signal: hangUp.signal })) {
      if (response.message.case === "registered") return { error: undefined, ms: Date.now() - started };
    }
    return { error: undefined, ms: Date.now() - started };
  } catch (error) {
    return { error: ConnectError.from(error), ms: Date.now() - started };
  } finally {
    clearTimeout(timeout);
    hangUp.abort();
  }
}

const registration = (fields: Record<string, unknown>): AttachRequest =>
  create(AttachRequestSchema, {
    message: {
      case: "register",
      value: { hostId: CONTRACT_HOST_ID, instanceId: crypto.randomUUID(), capacity: { workspaces: 1 }, agentVersion: "test", ...fields },
    },
  });

describe("Attach registration bounds", () => {
  it("ends a stream that sends no registration within the wait, as InvalidArgument on register", async () => {
    const { error, ms } = await attachWith(undefined);
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toMatch(/^register: no host registration within 300 ms/);
    expect(ms).toBeLessThan(3_000);
  });

  it("refuses oversized registration fields, naming each", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ instanceId: "i".repeat(10_000) }, "register.instance_id"],
      [{ agentVersion: "v".repeat(10_000) }, "register.agent_version"],
      [{ images: Array.from({ length: 1_000 }, (_, i) => `image-${i}`) }, "register.images"],
      [{ images: ["x".repeat(100_000)] }, "register.images[0]"],
      [{ backends: ["b".repeat(10_000)] }, "register.backends[0]"],
      [{ running: [{ workspaceId: "w", runId: "r".repeat(10_000) }] }, "register.running[0].run_id"],
    ];
    for (const [fields, field] of cases) {
      const { error } = await attachWith(registration(fields));
      expect(error?.code, field).toBe(Code.InvalidArgument);
      expect(error?.rawMessage.startsWith(`${field}: `), `${field}: ${error?.rawMessage}`).toBe(true);
    }
    // Within the bounds, the same host registers.
    expect((await attachWith(registration({ images: ["keel/sandbox-base:busybox"], backends: ["docker"] }))).error).toBeUndefined();
  });
});
