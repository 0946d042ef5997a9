// The docker-compose topology run as processes: one standalone PostgreSQL (the test cluster),
// two `keel serve` replicas on it, and one sandbox agent. Tokens are made with the CLI as the
// compose init service makes them; health is asked with `keel health` as its checks ask it.
import { spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmissionKind, AckState } from "../gen/keel/v1/emission_service_pb.js";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { KEEL_BIN, ROOT, killAllChildren, prepareLedger, startKeelServe, type ServerProcess } from "./support/child-processes.js";
import { connectClient, grpcClient } from "./support/clients.js";
import { createTestDatabase } from "./support/keel-fixture.js";
import { killAllChildren as killAgents, skipWithoutDocker, startSandboxAgent, uniqueHostId, removeContainersOfHost, type AgentProcess } from "./support/sandbox-support.js";

/** `keel …` against the ledger (no server needed), as an operator would run it. */
function keel(env: Record<string, string>, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const result = spawnSync(process.execPath, [KEEL_BIN, ...args], { cwd: ROOT, env: { ...process.env, ...env }, encoding: "utf8", timeout: 60_000 });
  return { status: result.status, stdout: result.stdout.trim(), stderr: result.stderr };
}

if (!skipWithoutDocker("deployment topology")) {
  describe("two replicas on one PostgreSQL with one sandbox agent", () => {
    const hostId = uniqueHostId("topology");
    let databaseUrl: string;
    let replicas: ServerProcess[] = [];
    let agent: AgentProcess;
    let connectorToken: string;
    let dataDir: string;

    beforeAll(async () => {
      databaseUrl = await createTestDatabase();
      await prepareLedger(databaseUrl, [DEMO_AGENT]);
      const env = { DATABASE_URL: databaseUrl };
      const connector = keel(env, "token", "create", "--role", "connector", "--connector", "topology");
      expect(connector.status, connector.stderr).toBe(0);
      connectorToken = connector.stdout;
      const host = keel(env, "token", "create", "--role", "sandbox-host", "--host-id", hostId, "--max-capacity", "2");
      expect(host.status, host.stderr).toBe(0);
      replicas = await Promise.all([0, 1].map(() => startKeelServe([], { DATABASE_URL: databaseUrl, KEEL_WORKERS: "2" })));
      dataDir = await mkdtemp(path.join(tmpdir(), "keel-topology-agent-"));
      agent = await startSandboxAgent({ url: replicas[0]!.url, token: host.stdout, hostId, dataDir, capacity: 2 });
    }, 120_000);

    afterAll(async () => {
      await killAgents();
      await killAllChildren();
      removeContainersOfHost(hostId);
      if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
    });

    it("has every replica report SERVING to keel health", () => {
      for (const replica of replicas) {
        const health = keel({}, "health", "--url", replica.url);
        expect(health.stdout).toBe("SERVING");
        expect(health.status).toBe(0);
      }
    });

    it("answers a message sent to one replica on the other replica's Subscribe", async () => {
      const [a, b] = replicas as [ServerProcess, ServerProcess];
      const submitted = await grpcClient(IngressService, b.url, connectorToken).submitMessage({
        agentId: DEMO_AGENT.id,
        conversationId: "topology-1",
        actor: { id: "operator" },
        messageId: "topology-message-1",
        text: "hello from replica b",
        connector: "topology",
      });
      const seen: { kind: EmissionKind; ackState: AckState; text: string }[] = [];
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(), 30_000);
      try {
        for await (const { emission } of connectClient(EmissionService, a.url, connectorToken).subscribe({ connector: "topology" }, { signal: abort.signal })) {
          if (emission === undefined || emission.runId !== submitted.runId) continue;
          seen.push({ kind: emission.kind, ackState: emission.ackState, text: emission.text });
          if (emission.kind === EmissionKind.REPLY) break;
        }
      } finally {
        clearTimeout(timer);
      }
      expect(seen.find((e) => e.kind === EmissionKind.ACK)?.ackState).toBe(AckState.WORKING);
      expect(seen.at(-1)).toMatchObject({ kind: EmissionKind.REPLY, text: expect.stringContaining("hello from replica b") as unknown });
    }, 60_000);

    it("keeps the sandbox agent attached, and the other replica serving when one stops", async () => {
      await agent.waitForLog((entry) => typeof entry["msg"] === "string" && /registered|attached/.test(entry["msg"]));
      const [a, b] = replicas as [ServerProcess, ServerProcess];
      await b.kill();
      expect(keel({}, "health", "--url", b.url, "--timeout-ms", "2000").status).not.toBe(0);
      expect(keel({}, "health", "--url", a.url).stdout).toBe("SERVING");
    }, 60_000);
  });
}
