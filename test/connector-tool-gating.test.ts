// Per-connector tool gating end to end (issue #13 item 8): one agent reached through two connectors,
// each granted a different tool. Through the real server, the catalog the model was sent (the
// stored model request) differs per connector, and a call to a tool not granted on the connector
// the run came from is refused before it runs, while the same call through the other one runs.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scriptedAgent, scriptedTurn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, ToolInvocationStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { waitFor } from "./support/child-processes.js";
import { grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { createTestTools, writesRecorded } from "./support/test-tools.js";

const ECHO = "test.echo.v1";
const APPEND = "test.append_line.v1";

let keel: TestKeel;
let effectsDir: string;
beforeAll(async () => {
  effectsDir = await mkdtemp(path.join(tmpdir(), "keel-gating-"));
  keel = await startTestKeel({
    tools: createTestTools({ effectsDir }),
    agents: [
      scriptedAgent(
        "gated",
        // Every run asks for both tools at once, then replies.
        [scriptedTurn("", [toolCall(APPEND, { key: "k" }), toolCall(ECHO, { text: "hi" })]), scriptedTurn("done")],
        {
          tools: [
            { toolName: ECHO, connectors: ["chat-slack"], readOnlyCommands: [] },
            { toolName: APPEND, connectors: ["ops-webhook"], readOnlyCommands: [] },
          ],
        },
      ),
    ],
  });
});
afterAll(async () => {
  await keel.stop();
  await rm(effectsDir, { recursive: true, force: true });
});

/** Submits one message through `connector` and returns the settled run's first step. */
async function runThrough(connector: string) {
  const ingress = grpcClient(IngressService, keel.url, keel.tokens.connector);
  const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
  const { runId } = await ingress.submitMessage({ agentId: "gated", conversationId: `c-${connector}`, actor: { id: "alice" }, messageId: `m-${connector}`, text: "go", connector });
  const run = await waitFor(
    `run ${runId} to settle`,
    async () => {
      const { run: current } = await runs.getRun({ runId });
      return current !== undefined && [RunStatus.SUCCEEDED, RunStatus.FAILED].includes(current.status) ? current : undefined;
    },
    30_000,
  );
  const { steps } = await runs.listRunSteps({ runId });
  const first = steps[0];
  if (first === undefined) throw new Error(`run ${runId} has no step`);
  const request = JSON.parse(first.modelCall?.requestJson ?? "{}") as { tools?: { name: string }[] };
  const byName = Object.fromEntries(first.toolInvocations.map((invocation) => [invocation.toolName, invocation]));
  return { run, advertised: (request.tools ?? []).map((tool) => tool.name), byName };
}

describe("per-connector tool gating through the real server", () => {
  it("advertises and runs only the tools granted on the connector a message came through", async () => {
    const slack = await runThrough("chat-slack");
    const webhook = await runThrough("ops-webhook");

    // What the model was offered: each connector's own grant, built-ins on both, never the other's.
    expect(slack.advertised).toContain(ECHO);
    expect(slack.advertised).not.toContain(APPEND);
    expect(webhook.advertised).toContain(APPEND);
    expect(webhook.advertised).not.toContain(ECHO);
    const builtIns = (names: string[]) => names.filter((name) => name.startsWith("keel.")).sort();
    expect(builtIns(slack.advertised)).toEqual(builtIns(webhook.advertised));
    expect(builtIns(slack.advertised).length).toBeGreaterThan(0);

    // What happened to the same two calls.
    expect(slack.byName[ECHO]).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED, resultText: "echo: hi" });
    expect(slack.byName[APPEND]).toMatchObject({ status: ToolInvocationStatus.REFUSED });
    expect(slack.byName[APPEND]?.refusalReason).toContain(`there is no tool "${APPEND}" in this run`);
    expect(webhook.byName[APPEND]).toMatchObject({ status: ToolInvocationStatus.SUCCEEDED });
    expect(webhook.byName[ECHO]).toMatchObject({ status: ToolInvocationStatus.REFUSED });
    expect(webhook.byName[ECHO]?.refusalReason).toContain(`there is no tool "${ECHO}" in this run`);

    // The write ran once, from the connector allowed it; both runs still finished.
    expect(writesRecorded(effectsDir)).toHaveLength(1);
    expect(slack.run.status).toBe(RunStatus.SUCCEEDED);
    expect(webhook.run.status).toBe(RunStatus.SUCCEEDED);
  });
});
