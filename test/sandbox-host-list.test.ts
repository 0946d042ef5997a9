// RunService.ListSandboxHosts (issue #15, the dashboard's hosts page): the fleet as the ledger has
// it. A host attached over a real Attach stream shows as connected on this replica with its
// capacity, labels and heartbeat, and as detached once its stream ends; a host with an active
// workspace lists the run holding it; pages follow host ids. Real server and PostgreSQL, gRPC.
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { AttachRequestSchema, SandboxService, type AttachRequest } from "../gen/keel/v1/sandbox_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const HOST_ID = "fleet-host";
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

let keel: TestKeel;
let db: pg.Client;
beforeAll(async () => {
  keel = await startTestKeel({ workers: 0, agents: [DEMO_AGENT] });
  db = new pg.Client({ connectionString: keel.databaseUrl });
  await db.connect();
});
afterAll(async () => {
  await db?.end();
  await keel?.stop();
});

/** Attaches the fixture's host over a real Attach stream; resolves once registered, with the hang-up. */
async function attach(): Promise<{ hangUp: () => void }> {
  const token = await keel.hostToken(HOST_ID, { labels: { zone: "eu-1" }, maxCapacity: 3 });
  const client = createClient(
    SandboxService,
    createGrpcTransport({
      baseUrl: keel.url,
      interceptors: [(next) => (request) => (request.header.set("authorization", `Bearer ${token}`), next(request))],
    }),
  );
  const ended = new AbortController();
  async function* requests(): AsyncGenerator<AttachRequest> {
    yield create(AttachRequestSchema, {
      message: {
        case: "register",
        value: {
          hostId: HOST_ID,
          instanceId: randomUUID(),
          capacity: { workspaces: 3, cpuMillis: 2_000, memoryBytes: 1n << 30n },
          labels: { zone: "eu-1" },
          backends: ["docker"],
          images: ["keel/sandbox-base:busybox"],
          agentVersion: "test",
        },
      },
    });
    await new Promise((resolve) => ended.signal.addEventListener("abort", resolve));
  }
  const registered = new Promise<void>((resolve, reject) => {
    void (async () => {
      try {
        for await (const response of client.attach(requests(), { signal: ended.signal })) if (response.message.case === "registered") resolve();
      } catch (error) {
        if (!ended.signal.aborted) reject(error instanceof Error ? error : new Error(String(error)));
      }
    })();
  });
  await registered;
  return { hangUp: () => ended.abort() };
}

const runs = () => grpcClient(RunService, keel.url, keel.tokens.operator);

describe("RunService.ListSandboxHosts", () => {
  it("lists attached and idle hosts with capacity, labels, heartbeat and the runs holding workspaces, page by page", async () => {
    const host = await attach();
    const { runId } = await grpcClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
      agentId: DEMO_AGENT.id,
      conversationId: "host-list",
      actor: { id: "alice" },
      messageId: "m-host-list",
      text: "hello",
      connector: "test",
    });
    await db.query("INSERT INTO sandbox_hosts (id, capacity, labels, backends, images) VALUES ('aa-idle', '{\"workspaces\": 2}', '{}', '[]', '[]')");
    await db.query("INSERT INTO sandbox_hosts (id, capacity, labels, backends, images) VALUES ('zz-busy', '{\"workspaces\": 1}', '{}', '[]', '[]')");
    await db.query("INSERT INTO workspaces (id, host_id, run_id, image, status) VALUES ($1, 'zz-busy', $2, 'img', 'active')", [randomUUID(), runId]);

    const first = await runs().listSandboxHosts({ pageSize: 2 });
    expect(first.hosts.map((h) => h.hostId)).toEqual(["aa-idle", HOST_ID]);
    expect(first.nextPageToken).not.toBe("");
    const second = await runs().listSandboxHosts({ pageSize: 2, pageToken: first.nextPageToken });
    expect(second.hosts.map((h) => h.hostId)).toEqual(["zz-busy"]);
    expect(second.nextPageToken).toBe("");

    const attached = first.hosts.find((h) => h.hostId === HOST_ID);
    expect(attached).toMatchObject({ connected: true, labels: { zone: "eu-1" }, backends: ["docker"], images: ["keel/sandbox-base:busybox"], workspacesInUse: 0, runIds: [] });
    expect(attached?.capacity).toMatchObject({ workspaces: 3, cpuMillis: 2_000, memoryBytes: 1n << 30n });
    expect(attached?.replicaId).not.toBe("");
    expect(attached?.lastHeartbeatAt).toBeDefined();
    expect(first.hosts.find((h) => h.hostId === "aa-idle")).toMatchObject({ connected: false, workspacesInUse: 0 });
    expect(second.hosts[0]).toMatchObject({ workspacesInUse: 1, runIds: [runId] });

    // The same at the command line.
    const { stdout } = await promisify(execFile)(process.execPath, [path.join(ROOT, "bin", "keel.js"), "hosts", "--url", keel.url, "--token", keel.tokens.operator], { timeout: 30_000 });
    const lines = stdout.trim().split("\n");
    expect(lines[0]).toMatch(/^HOST\s+STATE\s+WORKSPACES\s+LABELS\s+HEARTBEAT$/);
    expect(lines.slice(1).map((line) => line.split(/\s{2,}/).slice(0, 4))).toEqual([
      ["aa-idle", "detached", "0/2", "-"],
      [HOST_ID, `attached (${attached?.replicaId ?? ""})`, "0/3", "zone=eu-1"],
      ["zz-busy", "detached", "1/1", "-"],
    ]);

    // A host whose agent hangs up reads as detached.
    host.hangUp();
    for (let i = 0; i < 100; i++) {
      const { hosts } = await runs().listSandboxHosts({});
      if (hosts.find((h) => h.hostId === HOST_ID)?.connected === false) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error("the host still reads as connected after its stream ended");
  });

  it("refuses a page token it did not issue, and callers without an operator token", async () => {
    const bad = await runs().listSandboxHosts({ pageToken: "hosts-after:" }).catch((e: unknown) => ConnectError.from(e));
    expect(bad).toMatchObject({ code: Code.InvalidArgument, rawMessage: "page_token: is not a page token from ListSandboxHosts" });
    const asConnector = await grpcClient(RunService, keel.url, keel.tokens.connector)
      .listSandboxHosts({})
      .catch((e: unknown) => ConnectError.from(e));
    expect(asConnector).toMatchObject({ code: Code.PermissionDenied });
  });
});
