// The host's fence: execs and writes carry the sending worker's run-lease epoch, and a real
// sandbox agent refuses one from an epoch below the highest it has seen for the workspace, so a
// worker whose lease was taken over cannot act there after its successor has.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { scriptedAgent, scriptedTurn } from "../control-plane/src/fixtures/scripted-model.js";
import type { SandboxExec, WorkspaceGrant } from "../control-plane/src/tools/sandbox-dispatcher.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { killAllChildren, removeContainersOfHost, skipWithoutDocker, startSandboxAgent, uniqueHostId } from "./support/sandbox-support.js";

const skip = skipWithoutDocker("sandbox lease fence");
const AGENT = scriptedAgent("fenced", [scriptedTurn("ok")]);

describe.skipIf(skip)("the sandbox host's lease fence", () => {
  let keel: TestKeel;
  let dataDir: string;
  const hostId = uniqueHostId("fence");

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 1, agents: [AGENT] });
    dataDir = await mkdtemp(path.join(tmpdir(), "keel-fence-"));
    await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId), hostId, dataDir });
  }, 60_000);

  afterAll(async () => {
    await killAllChildren();
    await keel?.stop();
    removeContainersOfHost(hostId);
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  });

  it("runs commands up to the highest epoch seen, and refuses an exec or a write from a lower one", async () => {
    const suffix = randomBytes(4).toString("hex");
    const { runId } = await connectClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
      agentId: AGENT.id,
      conversationId: `fence-${suffix}`,
      actor: { id: "tester" },
      messageId: `fence-${suffix}`,
      text: "go",
      connector: "test",
    });
    const { dispatcher } = keel.app.sandbox;
    const grant: WorkspaceGrant = { runId, agentId: AGENT.id, image: AGENT.sandbox.image, labels: [], networkAccess: false, secrets: {}, secretSources: {} };
    const signal = AbortSignal.timeout(60_000);
    const workspaceId = await dispatcher.workspaceFor(grant, signal);
    const command = (text: string, leaseEpoch: number): SandboxExec => ({
      argv: ["sh", "-c", `echo ${text} >> /workspace/log; cat /workspace/log`],
      workingDirectory: "/workspace",
      env: {},
      timeoutMs: 10_000,
      maxOutputBytes: 1 << 20,
      leaseEpoch,
    });
    const exec = (text: string, epoch: number) => dispatcher.exec(workspaceId, `c-${text}-${suffix}`, command(text, epoch), async () => {}, signal);

    expect((await exec("first-holder", 1)).exitCode).toBe(0);
    // The lease moves on: the successor (epoch 2) acts, and from then on epoch 1 is refused.
    expect((await exec("successor", 2)).outputTail).toBe("first-holder\nsuccessor\n");
    await expect(exec("stale-worker", 1)).rejects.toThrow(/lease has moved on to epoch 2 .* this command is from epoch 1/);
    await expect(dispatcher.writeFile(workspaceId, "/workspace/stale.txt", new TextEncoder().encode("x"), signal, 1)).rejects.toThrow(/lease has moved on to epoch 2/);
    // Nothing of the stale worker's reached the workspace; the successor goes on.
    const after = await exec("successor-again", 2);
    expect(after.outputTail).toBe("first-holder\nsuccessor\nsuccessor-again\n");
    await dispatcher.writeFile(workspaceId, "/workspace/fresh.txt", new TextEncoder().encode("y"), signal, 3);
    const listed = await dispatcher.listFiles(workspaceId, "/workspace", signal);
    expect(listed.map((e) => e.path).sort()).toEqual(["/workspace/fresh.txt", "/workspace/log"]);
  });
});
