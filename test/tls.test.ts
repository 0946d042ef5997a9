// TLS end to end (issue #12, item 3): a real Keel serving both listeners over TLS with a
// certificate from `keel cert dev`'s CA, reached by grpc-js and Connect clients that verify
// it; a sandbox host's transport over mTLS, and refused without a client certificate; a
// sandbox agent process that refuses a plaintext control plane off loopback.
import { spawn } from "node:child_process";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { AttachRequestSchema, SandboxService } from "../gen/keel/v1/sandbox_service_pb.js";
import { writeDevCertificates, type DevCertificates } from "../control-plane/src/cli/cert-command.js";
import { createSandboxAgent } from "../sandbox-agent/src/sandbox-agent.js";
import type { WorkspaceBackend } from "../sandbox-agent/src/workspace-backend.js";
import { startListeningKeel, type ListeningKeel } from "./support/tls-keel.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

interface Pem {
  readonly ca: string;
  readonly serverCert: string;
  readonly serverKey: string;
  readonly clientCert: string;
  readonly clientKey: string;
}

async function readPem(files: DevCertificates): Promise<Pem> {
  const [ca, serverCert, serverKey, clientCert, clientKey] = await Promise.all(
    [files.ca, files.serverCert, files.serverKey, files.clientCert, files.clientKey].map((file) => readFile(file, "utf8")),
  );
  return { ca: ca!, serverCert: serverCert!, serverKey: serverKey!, clientCert: clientCert!, clientKey: clientKey! };
}

/** A backend with no workspaces: enough for a host to register and sit attached. */
const idleBackend: WorkspaceBackend = {
  name: "process",
  acquire: () => Promise.reject(new Error("not in this test")),
  exec: () => Promise.reject(new Error("not in this test")),
  readFile: () => Promise.reject(new Error("not in this test")),
  writeFile: () => Promise.reject(new Error("not in this test")),
  listFiles: () => Promise.reject(new Error("not in this test")),
  release: () => Promise.resolve(),
  list: () => Promise.resolve([]),
  reap: () => Promise.resolve([]),
  close: () => Promise.resolve(),
};

async function until(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return true;
}

describe("TLS on both listeners", () => {
  let keel: ListeningKeel;
  let pem: Pem;

  beforeAll(async () => {
    pem = await readPem(await writeDevCertificates(path.join(await mkdtemp(path.join(tmpdir(), "keel-tls-")), "certs")));
    // A short idle timeout, so the HTTP/1.1-over-TLS connections below also meet it.
    keel = await startListeningKeel({ tls: { cert: pem.serverCert, key: pem.serverKey, clientCa: pem.ca }, env: { KEEL_HTTP2_IDLE_TIMEOUT_MS: "1000" } });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  it("serves https URLs and writes 0600 files for keel cert dev", async () => {
    expect(keel.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    expect(keel.http1Url).toMatch(/^https:\/\//);
    const files = await writeDevCertificates(path.join(await mkdtemp(path.join(tmpdir(), "keel-tls-modes-")), "c"));
    const { stat } = await import("node:fs/promises");
    for (const file of [files.ca, files.serverKey, files.serverCert, files.clientKey, files.clientCert]) {
      expect(((await stat(file)).mode & 0o777).toString(8)).toBe("600");
    }
  });

  it("answers grpc-js over TLS, verifying the server against the test CA, and fails without it", async () => {
    const definition = await protoLoader.load(["keel/v1/run_service.proto"], { includeDirs: [path.join(ROOT, "proto")], keepCase: true, longs: String, enums: String, defaults: true });
    const v1 = (grpc.loadPackageDefinition(definition)["keel"] as grpc.GrpcObject)["v1"] as grpc.GrpcObject;
    const Service = v1["RunService"] as grpc.ServiceClientConstructor;
    const address = keel.url.replace(/^https:\/\//, "");
    const listRuns = (credentials: grpc.ChannelCredentials) =>
      new Promise<{ runs: unknown[] }>((resolve, reject) => {
        const client = new Service(address, credentials, { "grpc.ssl_target_name_override": "localhost" });
        const metadata = new grpc.Metadata();
        metadata.set("authorization", `Bearer ${keel.tokens.operator}`);
        const call = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata, o: grpc.CallOptions, cb: (e: grpc.ServiceError | null, v: unknown) => void) => void>)["ListRuns"]!;
        call.call(client, { page_size: 5 }, metadata, { deadline: Date.now() + 5_000 }, (error, value) => {
          client.close();
          if (error === null) resolve(value as { runs: unknown[] });
          else reject(error);
        });
      });
    const trusted = await listRuns(grpc.credentials.createSsl(Buffer.from(pem.ca)));
    expect(trusted.runs).toEqual([]);
    // The system CAs do not know the test CA: the handshake fails, no call goes through.
    await expect(listRuns(grpc.credentials.createSsl())).rejects.toMatchObject({ code: grpc.status.UNAVAILABLE });
  });

  it("answers Connect over TLS on HTTP/2 (ALPN h2), HTTP/1.1 on the same port, and the HTTP/1.1 port", async () => {
    const bearer = [
      (next: Parameters<import("@connectrpc/connect").Interceptor>[0]) => (request: Parameters<typeof next>[0]) => {
        request.header.set("authorization", `Bearer ${keel.tokens.operator}`);
        return next(request);
      },
    ];
    const transports = [
      createConnectTransport({ baseUrl: keel.url, httpVersion: "2", nodeOptions: { ca: pem.ca }, interceptors: bearer }),
      createConnectTransport({ baseUrl: keel.url, httpVersion: "1.1", nodeOptions: { ca: pem.ca }, interceptors: bearer }),
      createConnectTransport({ baseUrl: keel.http1Url, httpVersion: "1.1", nodeOptions: { ca: pem.ca }, interceptors: bearer }),
      createGrpcTransport({ baseUrl: keel.url, nodeOptions: { ca: pem.ca }, interceptors: bearer }),
    ];
    for (const transport of transports) {
      const reply = await createClient(RunService, transport).listRuns({ pageSize: 5 });
      expect(reply.runs).toEqual([]);
    }
    // Past the idle timeout the server has dropped those connections; new calls still work.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    for (const transport of transports) {
      expect((await createClient(RunService, transport).listRuns({ pageSize: 5 })).runs).toEqual([]);
    }
    // Without the CA the client refuses the server's certificate.
    const untrusted = createClient(RunService, createConnectTransport({ baseUrl: keel.url, httpVersion: "2", interceptors: bearer }));
    await expect(untrusted.listRuns({ pageSize: 5 })).rejects.toThrow(/certificate/i);
  });

  it("attaches a sandbox host over mTLS with its client certificate", async () => {
    const hostId = "tls-host-1";
    const { secret } = await keel.app.tokens.create("sandbox-host", "tls", { scope: { kind: "sandbox-host", hostId, maxCapacity: 4, labels: {} } });
    const agent = createSandboxAgent({
      controlPlaneUrl: keel.url,
      tls: { ca: pem.ca, cert: pem.clientCert, key: pem.clientKey },
      token: secret,
      hostId,
      capacity: 1,
      labels: {},
      images: [],
      backend: idleBackend,
      log: pino({ level: process.env["KEEL_TEST_LOG"] ?? "silent" }),
      agentVersion: "test",
      cpuMillis: 1000,
      memoryBytes: 1 << 30,
    });
    const running = agent.run();
    try {
      expect(await until(() => keel.app.sandbox.hub.isAttached(hostId), 10_000)).toBe(true);
    } finally {
      await agent.stop();
      await running;
    }
  });

  it("runs a real sandbox agent process over mTLS, and one without a client certificate never attaches", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "keel-tls-agent-"));
    const files = { ca: path.join(dir, "ca.crt"), cert: path.join(dir, "client.crt"), key: path.join(dir, "client.key") };
    await Promise.all([writeFile(files.ca, pem.ca), writeFile(files.cert, pem.clientCert), writeFile(files.key, pem.clientKey)]);
    const agentProcess = async (hostId: string, withCert: boolean) => {
      const { secret } = await keel.app.tokens.create("sandbox-host", hostId, { scope: { kind: "sandbox-host", hostId, maxCapacity: 2, labels: {} } });
      const child = spawn(
        process.execPath,
        [path.join(ROOT, "bin", "keel.js"), "sandbox-agent", "--control-plane", keel.url, "--backend", "process", "--host-id", hostId,
          "--capacity", "1", "--data-dir", path.join(dir, hostId), "--ca", files.ca, ...(withCert ? ["--tls-cert", files.cert, "--tls-key", files.key] : [])],
        { cwd: ROOT, env: { ...process.env, KEEL_SANDBOX_TOKEN: secret, KEEL_LOG_LEVEL: "info" }, stdio: ["ignore", "pipe", "pipe"] },
      );
      let log = "";
      child.stdout.on("data", (chunk: Buffer) => (log += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (log += chunk.toString()));
      return { child, log: () => log };
    };
    const good = await agentProcess("tls-proc-good", true);
    const bad = await agentProcess("tls-proc-bad", false);
    try {
      expect(await until(() => keel.app.sandbox.hub.isAttached("tls-proc-good"), 20_000)).toBe(true);
      expect(await until(() => /client certificate/.test(bad.log()), 20_000)).toBe(true);
      expect(keel.app.sandbox.hub.isAttached("tls-proc-bad")).toBe(false);
    } finally {
      for (const agent of [good, bad]) agent.child.kill("SIGTERM");
      await Promise.all([good, bad].map(({ child }) => (child.exitCode !== null ? Promise.resolve() : new Promise((resolve) => child.once("exit", resolve)))));
    }
  });

  it("refuses SandboxService without a client certificate (valid token) as Unauthenticated, before any message", async () => {
    const client = createClient(
      SandboxService,
      createGrpcTransport({
        baseUrl: keel.url,
        nodeOptions: { ca: pem.ca },
        interceptors: [
          (next) => (request) => {
            request.header.set("authorization", `Bearer ${keel.tokens["sandbox-host"]}`);
            return next(request);
          },
        ],
      }),
    );
    async function* never() {
      yield create(AttachRequestSchema, {});
      await new Promise(() => {}); // the stream never sends its registration
    }
    const attempt = (async () => {
      for await (const _ of client.attach(never(), { signal: AbortSignal.timeout(5_000) })) break;
    })();
    const error = await attempt.then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(error?.code).toBe(Code.Unauthenticated);
    expect(error?.rawMessage).toMatch(/client certificate/);
    expect(keel.app.sandbox.hub.isAttached("tls-host-2")).toBe(false);
  });
});

describe("the sandbox agent's plaintext rule", () => {
  function agentExit(args: string[]): Promise<{ code: number | null; stderr: string }> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [path.join(ROOT, "bin", "keel.js"), "sandbox-agent", ...args], {
        cwd: ROOT,
        env: { ...process.env, KEEL_SANDBOX_TOKEN: "not-used", KEEL_LOG_LEVEL: "silent" },
        stdio: ["ignore", "ignore", "pipe"],
      });
      let stderr = "";
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
      child.on("error", reject);
      child.on("exit", (code) => {
        clearTimeout(timer);
        resolve({ code, stderr });
      });
    });
  }

  it("refuses an http:// control plane that is not loopback, naming --insecure", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "keel-agent-plain-"));
    const { code, stderr } = await agentExit(["--control-plane", "http://192.0.2.10:7070", "--backend", "process", "--data-dir", dataDir]);
    expect(code).toBe(2);
    expect(stderr).toMatch(/refusing plaintext http:\/\/ to 192\.0\.2\.10/);
    expect(stderr).toMatch(/--insecure/);
  });
});
