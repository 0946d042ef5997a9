// Issue #12 item 1: a sandbox-host token is one host. It may not register as another host, with
// more capacity or other labels, nor take over the live session of another agent instance; a
// registrant that is not the previous process never inherits its re-attach commands. Revoking
// the token ends its open Attach within 5 s. Real server, real PostgreSQL, a Connect gRPC client.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AttachRequestSchema, SandboxService, type AttachRequest, type AttachResponse } from "../gen/keel/v1/sandbox_service_pb.js";
import { HostLostError } from "../control-plane/src/sandbox/sandbox-hub.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

let keel: TestKeel;
beforeAll(async () => {
  keel = await startTestKeel({ workers: 0 });
});
afterAll(async () => {
  await keel.stop();
});

interface Registration {
  hostId: string;
  instanceId?: string;
  workspaces?: number;
  labels?: Record<string, string>;
}

/** An Attach stream that registers and then stays open until `close()`. */
function attach(token: string, registration: Registration) {
  const hangUp = new AbortController();
  let release: () => void = () => {};
  const held = new Promise<void>((resolve) => (release = resolve));
  async function* requests(): AsyncGenerator<AttachRequest> {
    yield create(AttachRequestSchema, {
      message: {
        case: "register",
        value: {
          hostId: registration.hostId,
          instanceId: registration.instanceId ?? crypto.randomUUID(),
          capacity: { workspaces: registration.workspaces ?? 2 },
          labels: registration.labels ?? {},
          agentVersion: "test",
        },
      },
    });
    await held;
  }
  const client = createClient(
    SandboxService,
    createGrpcTransport({
      baseUrl: keel.url,
      interceptors: [(next) => (request) => (request.header.set("authorization", `Bearer ${token}`), next(request))],
    }),
  );
  const responses: AttachResponse[] = [];
  let registered: () => void = () => {};
  const first = new Promise<void>((resolve) => (registered = resolve));
  const ended = (async () => {
    try {
      for await (const response of client.attach(requests(), { signal: hangUp.signal })) {
        responses.push(response);
        registered();
      }
      return undefined;
    } catch (error) {
      return ConnectError.from(error);
    } finally {
      registered();
    }
  })();
  return {
    responses,
    /** Resolves once registered, or with the error that refused the registration. */
    outcome: Promise.race([first.then(() => (responses.length > 0 ? ("registered" as const) : undefined)), ended]).then(async (r) => r ?? (await ended)),
    ended,
    close() {
      release();
      hangUp.abort();
    },
  };
}

const refusal = async (token: string, registration: Registration): Promise<ConnectError | "registered" | undefined> => {
  const stream = attach(token, registration);
  try {
    return await stream.outcome;
  } finally {
    stream.close();
  }
};

describe("a sandbox-host token", () => {
  it("registers only as its own host, within its capacity and labels", async () => {
    const token = await keel.hostToken("host-a", { labels: { pool: "a" }, maxCapacity: 4 });
    const other = await refusal(token, { hostId: "host-b" });
    expect(other).toBeInstanceOf(ConnectError);
    expect((other as ConnectError).code).toBe(Code.PermissionDenied);
    expect((other as ConnectError).rawMessage).toMatch(/register\.host_id/);
    const greedy = (await refusal(token, { hostId: "host-a", workspaces: 5 })) as ConnectError;
    expect([greedy.code, greedy.rawMessage.includes("register.capacity.workspaces")]).toEqual([Code.PermissionDenied, true]);
    const wrongValue = (await refusal(token, { hostId: "host-a", labels: { pool: "b" } })) as ConnectError;
    expect([wrongValue.code, wrongValue.rawMessage.includes("register.labels")]).toEqual([Code.PermissionDenied, true]);
    const extraLabel = (await refusal(token, { hostId: "host-a", labels: { gpu: "yes" } })) as ConnectError;
    expect([extraLabel.code, extraLabel.rawMessage.includes("register.labels")]).toEqual([Code.PermissionDenied, true]);
    expect(keel.app.sandbox.hub.isAttached("host-b")).toBe(false);
    expect(await refusal(token, { hostId: "host-a", workspaces: 4, labels: { pool: "a" } })).toBe("registered");
  });

  it("cannot take over a live session of another instance, nor with another token", async () => {
    const token = await keel.hostToken("host-live");
    const instanceId = crypto.randomUUID();
    const real = attach(token, { hostId: "host-live", instanceId });
    try {
      expect(await real.outcome).toBe("registered");
      const impostor = (await refusal(token, { hostId: "host-live" })) as ConnectError;
      expect(impostor.code).toBe(Code.FailedPrecondition);
      expect(impostor.rawMessage).toMatch(/another live agent instance/);
      // Knowing the instance id is not enough without the same token.
      const thief = (await refusal(await keel.hostToken("host-live"), { hostId: "host-live", instanceId })) as ConnectError;
      expect(thief.code).toBe(Code.FailedPrecondition);
      expect(keel.app.sandbox.hub.isAttached("host-live")).toBe(true);
      // The same process on a new stream (a reconnect) may replace its own session.
      expect(await refusal(token, { hostId: "host-live", instanceId })).toBe("registered");
    } finally {
      real.close();
    }
    // Once the session is gone, a new instance registers (a restarted agent).
    await expect.poll(() => keel.app.sandbox.hub.isAttached("host-live")).toBe(false);
    expect(await refusal(token, { hostId: "host-live" })).toBe("registered");
  });

  it("hands a departed host's re-attach commands to no registrant with another token", async () => {
    const hub = keel.app.sandbox.hub;
    const instanceId = crypto.randomUUID();
    const registration = { hostId: "host-grace", instanceId, capacity: { workspaces: 1, cpuMillis: 0, memoryBytes: 0 }, labels: {}, backends: [], images: [], running: [], agentVersion: "t" };
    const first = await hub.attach(registration, { tokenId: "token-real" });
    const command = { commandId: crypto.randomUUID(), action: { kind: "release" as const, workspaceId: crypto.randomUUID() } };
    const outcome = hub.send("host-grace", command, {}, AbortSignal.timeout(10_000), 10_000).then(
      () => "answered",
      (error: unknown) => error,
    );
    const sent = first.commands[Symbol.asyncIterator]();
    expect((await sent.next()).value).toEqual(command);
    first.close("the stream dropped"); // departed, within the reconnect grace
    const impostor = await hub.attach(registration, { tokenId: "token-stolen-instance-id" });
    // The waiting command is declared lost rather than re-attached to the newcomer...
    expect(await outcome).toBeInstanceOf(HostLostError);
    // ...and the newcomer's command stream carries no re-attach for it.
    const next = impostor.commands[Symbol.asyncIterator]().next();
    const nothing = await Promise.race([next.then(() => "command"), new Promise((resolve) => setTimeout(() => resolve("nothing"), 300))]);
    expect(nothing).toBe("nothing");
    impostor.close("done");
  });

  it("ends an open Attach within 5 s of its token's revocation", async () => {
    const { id, secret } = await keel.app.tokens.create("sandbox-host", "revoked host", {
      scope: { kind: "sandbox-host", hostId: "host-revoked", maxCapacity: 2, labels: {} },
    });
    const stream = attach(secret, { hostId: "host-revoked" });
    try {
      expect(await stream.outcome).toBe("registered");
      const revokedAt = Date.now();
      expect(await keel.app.tokens.revoke(id)).toBe(true);
      const error = await stream.ended;
      expect(error?.code).toBe(Code.Unauthenticated);
      expect(Date.now() - revokedAt).toBeLessThan(5_000);
      await expect.poll(() => keel.app.sandbox.hub.isAttached("host-revoked")).toBe(false);
    } finally {
      stream.close();
    }
  });
});
