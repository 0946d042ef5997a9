// Sandbox hosts as one fleet for every replica on a ledger (issue #17, build item 1): placement
// and capacity live in PostgreSQL, a command for a host attached to another replica is relayed
// to it, a run that moves between replicas keeps its workspace, and an agent given several
// control planes re-attaches to the next when its own goes away.
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import type { AgentSpec, ScriptedTurn } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedTurn, toolCall as call, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createSandboxRepository } from "../control-plane/src/ledger/sandbox.repository.js";
import type { WorkspaceGrant } from "../control-plane/src/tools/sandbox-dispatcher.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { killAllChildren, removeContainersOfHost, skipWithoutDocker, startSandboxAgent, uniqueHostId, waitFor, type AgentProcess } from "./support/sandbox-support.js";

const SANDBOX_TOOLS = ["sandbox.exec.v1", "sandbox.read_file.v1", "sandbox.write_file.v1", "sandbox.list_files.v1"];
const turn = (toolCalls: ScriptedTurn["toolCalls"], options: { reply?: string; delayMs?: number } = {}): ScriptedTurn =>
  scriptedTurn(options.reply ?? "", toolCalls, { delayMs: options.delayMs ?? 0, inputTokens: 10, outputTokens: 10 });
const sandboxAgent = (id: string, turns: ScriptedTurn[]): AgentSpec =>
  scriptedAgent(id, turns, { displayName: id, tools: toolGrants(SANDBOX_TOOLS), sandbox: { ...DEMO_AGENT.sandbox } });

/** A secret every replica has in its environment; the workspace gets it from the one holding the host. */
const FLEET_SECRET = `fleet-${randomBytes(12).toString("hex")}`;
const SECRET_ENV = { KEEL_SECRET_FLEET_TOKEN: FLEET_SECRET };

/** Writes on the replica that claimed it, then reads the file back (and a digest of its secret) with a shell command. */
const RELAYED: AgentSpec = {
  ...sandboxAgent("fleet-relayed", [
    turn([call("sandbox.write_file.v1", { path: "notes/plan.txt", content: "written through the relay\n" })]),
    turn([call("sandbox.exec.v1", { command: 'cat notes/plan.txt && echo ran && echo to-stderr >&2 && printf %s "$FLEET_TOKEN" | md5sum' })]),
    turn([], { reply: "relayed" }),
  ]),
  sandbox: { ...DEMO_AGENT.sandbox, secrets: [{ envVar: "FLEET_TOKEN", sourceEnv: "KEEL_SECRET_FLEET_TOKEN" }] },
};

/** Writes, then thinks long enough for its replica to be stopped, then reads the file. */
const MOVER = sandboxAgent("fleet-mover", [
  turn([call("sandbox.write_file.v1", { path: "keep.txt", content: "written before the move\n" })]),
  turn([call("sandbox.exec.v1", { command: "cat keep.txt" })], { delayMs: 8_000 }),
  turn([], { reply: "moved" }),
]);

async function query<T>(databaseUrl: string, text: string, params: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    return (await client.query(text, params)).rows as T[];
  } finally {
    await client.end();
  }
}

async function submit(keel: TestKeel, agentId: string): Promise<string> {
  const suffix = randomBytes(4).toString("hex");
  const { runId } = await connectClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
    agentId,
    conversationId: `fleet-${agentId}-${suffix}`,
    actor: { id: "tester" },
    messageId: `fleet-${suffix}`,
    text: "go",
    connector: "test",
  });
  return runId;
}

describe("sandbox placement in the ledger", () => {
  let a: TestKeel;
  let b: TestKeel;

  beforeAll(async () => {
    // No workers: the run the placements name stays queued, so no sweeper releases anything.
    a = await startTestKeel({ workers: 0 });
    b = await startTestKeel({ workers: 0, databaseUrl: a.databaseUrl });
  }, 60_000);

  afterAll(async () => {
    await a?.stop();
    await b?.stop();
  });

  it("never exceeds a capacity-10 host with two replicas placing 50 workspaces at once", async () => {
    const hostId = uniqueHostId("capacity");
    const replicaA = createSandboxRepository(a.app.ledger.sql, { replicaId: "replica-a", liveMs: 60_000 });
    const replicaB = createSandboxRepository(b.app.ledger.sql, { replicaId: "replica-b", liveMs: 60_000 });
    const capacity = { workspaces: 10, cpuMillis: 1_000, memoryBytes: 1 << 30 };
    const instanceId = randomUUID();
    await replicaB.registerHost({ hostId, instanceId, capacity, labels: {}, backends: ["docker"], images: [] });
    // Another replica sees which agent instance holds the host (its hub refuses any other one).
    expect(await replicaA.instanceAttachedElsewhere(hostId)).toBe(instanceId);
    expect(await replicaB.instanceAttachedElsewhere(hostId)).toBeUndefined();
    const runId = await submit(a, DEMO_AGENT.id);

    const place = (i: number) => (i % 2 === 0 ? replicaA : replicaB).placeWorkspace({ id: randomUUID(), hostId, runId, image: "img" });
    const placed = await Promise.all(Array.from({ length: 50 }, (_, i) => place(i)));
    expect(placed.filter(Boolean)).toHaveLength(10);
    const active = async () =>
      (await query<{ n: number }>(a.databaseUrl, "SELECT count(*)::int AS n FROM workspaces WHERE host_id = $1 AND status = 'active'", [hostId]))[0]?.n;
    expect(await active()).toBe(10);
    // Every replica sees the host full, and the route to the replica that holds it.
    expect((await replicaA.liveHosts()).find((h) => h.hostId === hostId)).toMatchObject({ replicaId: "replica-b", active: 10 });
    expect(await replicaA.hostReplica(hostId)).toBe("replica-b");

    // One slot frees up: of 20 placements racing for it, exactly one gets it.
    const [one] = await query<{ id: string }>(a.databaseUrl, "SELECT id FROM workspaces WHERE host_id = $1 AND status = 'active' LIMIT 1", [hostId]);
    expect(await replicaA.finish(one!.id, "released")).toBe(true);
    const again = await Promise.all(Array.from({ length: 20 }, (_, i) => place(i)));
    expect(again.filter(Boolean)).toHaveLength(1);
    expect(await active()).toBe(10);

    // A host whose replica let go of it is placed on by nobody.
    await replicaB.hostDisconnected(hostId);
    expect(await replicaA.hostReplica(hostId)).toBeUndefined();
    await replicaB.finish(one!.id, "released");
    expect(await place(0)).toBe(false);
  }, 90_000);
});

const skip = skipWithoutDocker("sandbox fleet");

describe.skipIf(skip)("one sandbox host shared by three replicas", () => {
  let a: TestKeel;
  let b: TestKeel;
  let c: TestKeel;
  let agent: AgentProcess;
  let dataDir: string;
  let moverRunId: string;
  const hostId = uniqueHostId("fleet");

  beforeAll(async () => {
    // Only A runs workers at first, so A claims every run; the host attaches to B (then C).
    a = await startTestKeel({ workers: 1, agents: [RELAYED, MOVER], env: SECRET_ENV });
    // Configured with one worker each but not started (workers: 0): B starts its own when A stops.
    const shared = { databaseUrl: a.databaseUrl, workers: 0, env: { KEEL_WORKERS: "1", ...SECRET_ENV }, agents: [] };
    [b, c] = await Promise.all([startTestKeel(shared), startTestKeel(shared)]);
    dataDir = await mkdtemp(path.join(tmpdir(), "keel-fleet-"));
    agent = await startSandboxAgent({ url: `${b.url},${c.url}`, token: await a.hostToken(hostId), hostId, dataDir, capacity: 4 });
  }, 90_000);

  afterAll(async () => {
    await killAllChildren();
    await Promise.all([a, b, c].map((keel) => keel?.stop().catch(() => {})));
    removeContainersOfHost(hostId);
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  });

  const settled = (keel: TestKeel, runId: string) =>
    waitFor(
      `run ${runId} to settle`,
      async () => {
        const { run } = await connectClient(RunService, keel.url, keel.tokens.operator).getRun({ runId });
        return run !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.WAITING, RunStatus.CANCELLED, RunStatus.BUDGET_EXHAUSTED].includes(run.status)
          ? run
          : undefined;
      },
      90_000,
      200,
    );

  const invocations = async (keel: TestKeel, runId: string) => {
    const { steps } = await connectClient(RunService, keel.url, keel.tokens.operator).listRunSteps({ runId });
    return steps.flatMap((step) => step.toolInvocations);
  };

  const stdout = (invocation: { observations: { stream: string; text: string }[] } | undefined) =>
    (invocation?.observations ?? []).filter((o) => o.stream === "stdout").map((o) => o.text).join("");

  it("runs a run claimed by replica A on the host attached to replica B", async () => {
    expect(b.app.sandbox.hub.isAttached(hostId)).toBe(true);
    expect(a.app.sandbox.hub.isAttached(hostId)).toBe(false);
    const runId = await submit(a, RELAYED.id);
    const run = await settled(a, runId);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("relayed");

    const [write, exec] = await invocations(a, runId);
    expect(write).toMatchObject({ toolName: "sandbox.write_file.v1", status: ToolInvocationStatus.SUCCEEDED });
    expect(exec).toMatchObject({ toolName: "sandbox.exec.v1", status: ToolInvocationStatus.SUCCEEDED, exitCode: 0 });
    // The output came back through the ledger to A, which recorded it as the command ran. The
    // workspace had the secret: B read it from its own environment, by the name the relay carried.
    const digest = createHash("md5").update(FLEET_SECRET).digest("hex");
    expect(stdout(exec)).toBe(`written through the relay\nran\n${digest}  -\n`);
    expect((exec?.observations ?? []).filter((o) => o.stream === "stderr").map((o) => o.text).join("")).toBe("to-stderr\n");
    const rows = await query<{ host_id: string; status: string }>(a.databaseUrl, "SELECT host_id, status FROM workspaces WHERE run_id = $1", [runId]);
    expect(rows).toEqual([{ host_id: hostId, status: "active" }]);
    // Nothing is left in transit.
    const relays = await query<{ n: number }>(a.databaseUrl, "SELECT count(*)::int AS n FROM sandbox_relays");
    expect(relays[0]?.n).toBe(0);
  }, 90_000);

  it("keeps the files of a run moved from replica A to replica B mid-way", async () => {
    moverRunId = await submit(a, MOVER.id);
    // The write is committed and the model is thinking (8 s): A goes away now.
    await waitFor(
      "the mover's write to be committed",
      async () =>
        (
          await query<{ status: string }>(a.databaseUrl, "SELECT status FROM tool_invocations WHERE run_id = $1 AND tool_name = 'sandbox.write_file.v1'", [
            moverRunId,
          ])
        ).find((r) => r.status === "succeeded"),
      60_000,
    );
    await a.stop();
    b.app.startWorkers();
    const run = await settled(b, moverRunId);
    expect(run.status).toBe(RunStatus.SUCCEEDED);
    const [, exec] = await invocations(b, moverRunId);
    expect(exec).toMatchObject({ toolName: "sandbox.exec.v1", status: ToolInvocationStatus.SUCCEEDED });
    expect(stdout(exec)).toBe("written before the move\n");
    // Another claim took the run over, and it used the same workspace, never a fresh one.
    const [lease] = await query<{ lease_epoch: string }>(a.databaseUrl, "SELECT lease_epoch FROM runs WHERE id = $1", [moverRunId]);
    expect(Number(lease?.lease_epoch)).toBeGreaterThan(1);
    const rows = await query<{ status: string }>(a.databaseUrl, "SELECT status FROM workspaces WHERE run_id = $1", [moverRunId]);
    expect(rows).toEqual([{ status: "active" }]);
  }, 150_000);

  it("re-attaches the agent to the next control plane when its own goes away, workspaces intact", async () => {
    expect(moverRunId).toBeDefined();
    await b.stop();
    await waitFor("the host to attach to replica C", () => (c.app.sandbox.hub.isAttached(hostId) ? true : undefined), 60_000);
    await agent.waitForLog((entry) => entry["msg"] === "attached to the control plane" && entry["controlPlane"] === c.url);
    const grant: WorkspaceGrant = { runId: moverRunId, agentId: MOVER.id, image: MOVER.sandbox.image, labels: [], networkAccess: false, secrets: {}, secretSources: {} };
    const signal = AbortSignal.timeout(60_000);
    const [before] = await query<{ id: string }>(c.databaseUrl, "SELECT id FROM workspaces WHERE run_id = $1", [moverRunId]);
    expect(await c.app.sandbox.dispatcher.workspaceFor(grant, signal)).toBe(before?.id);
    const data = await c.app.sandbox.dispatcher.readFile(before!.id, "/workspace/keep.txt", 1024, signal);
    expect(new TextDecoder().decode(data)).toBe("written before the move\n");
    const rows = await query<{ status: string }>(c.databaseUrl, "SELECT status FROM workspaces WHERE run_id = $1", [moverRunId]);
    expect(rows).toEqual([{ status: "active" }]);
  }, 90_000);
});
