// The dashboard's WorkGraph view and a human gate decided in it (issue #15), end to end: a real
// Keel, a scripted root that proposes a → gate → b, a provider that answers the child runs, and
// Debian's chromium driven by playwright-core. The operator sees "a" done and the gate waiting,
// approves it with a reason, and watches "b" run and the root reply. Every wait is on a DOM
// condition or a run state, never a fixed sleep. Skips with a reason when chromium is absent;
// KEEL_REQUIRE_BROWSER=1 (CI) fails instead, as test/dashboard.test.ts does.
import path from "node:path";
import pg from "pg";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConnectError, Code } from "@connectrpc/connect";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { ExecutionShape, WaitReason, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { GateDecision, WorkNodeStatus } from "../gen/keel/v1/work_graph_pb.js";
import { DEFAULT_GRAPH_CEILINGS } from "../control-plane/src/domain/agent.js";
import { scriptedAgent, scriptedTurn as turn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import type { ModelProvider, ModelRequest } from "../control-plane/src/models/model-provider.js";
import type { RunnerDeps } from "../control-plane/src/runner/runner.js";
import { openBrowser, SHOTS, skipsWithoutBrowser, UI_TIMEOUT_MS, waitForRun as waitForRunState } from "./support/browser.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { graphRootAgent, NODE_SLICE } from "./support/graph-children.js";

const SKIPS = skipsWithoutBrowser("the dashboard WorkGraph browser test");

const OPERATOR = "olivia";
const REASON = "the draft reads well";

const PROPOSE = "keel.propose_work_graph.v1";
const GATED = {
  nodes: [
    { key: "a", kind: "agent_loop", objective: "Draft the release notes", budget: NODE_SLICE },
    { key: "gate", kind: "human_gate", objective: "A person checks the draft before it goes out" },
    { key: "b", kind: "agent_loop", objective: "Publish the approved release notes", budget: NODE_SLICE },
  ],
  edges: [
    { from: "a", to: "gate" },
    { from: "gate", to: "b" },
  ],
};
const FINAL_REPLY = "Drafted, approved and published the release notes.";
/** Side models answer nothing useful: triage falls back to a loop without touching the primary script. */
const base = scriptedAgent("dash-gate", [turn("", [toolCall(PROPOSE, GATED)]), turn(FINAL_REPLY)]);
const gatedAgent = graphRootAgent(base, { ...DEFAULT_GRAPH_CEILINGS, maxNodes: 4, maxDepth: 3 });

const CHILD_MARK = /^You are doing one part of a larger task: node "([^"]+)"/;
/** The child runs' model: each node's child answers at once with its key. */
function childAware(deps: RunnerDeps): RunnerDeps {
  const scripted = deps.providers.scripted;
  const provider: ModelProvider = {
    ...scripted,
    complete(request: ModelRequest) {
      const input = request.messages.find((m) => m.role === "user" && CHILD_MARK.test(m.content))?.content ?? "";
      const match = CHILD_MARK.exec(input);
      if (match === null) return scripted.complete(request);
      return Promise.resolve({ text: `result of ${match[1]}`, toolCalls: [], usage: { inputTokens: 100, outputTokens: 10 }, finishReason: "stop" as const });
    },
  };
  return { ...deps, providers: { ...deps.providers, scripted: provider } };
}

describe.skipIf(SKIPS)("the dashboard's WorkGraph view in chromium", () => {
  let keel: TestKeel;
  let db: pg.Client;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    keel = await startTestKeel({ workers: 3, agents: [gatedAgent], wrapRunnerDeps: childAware, env: { KEEL_IDLE_POLL_MS: "250" } });
    db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    ({ browser, page } = await openBrowser({ width: 1280, height: 900 }));
  });

  afterAll(async () => {
    await browser?.close();
    await db?.end();
    await keel?.stop();
  });

  const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);

  const waitForRun = (runId: string, done: (run: Run) => boolean): Promise<Run> => waitForRunState(keel.url, keel.tokens.operator, runId, done);

  const node = (key: string) => page.locator(`li.graph-node[data-node-key="${key}"]`);
  const runStatus = () => page.getByTestId("run-status");

  it("shows the graph with the gate waiting, approves it, and the graph runs on to the reply", { timeout: 180_000 }, async () => {
    await page.goto(`${keel.http1Url}/`);
    await page.getByLabel("Operator token").fill(keel.tokens.operator);
    await page.getByLabel(/Your name/).fill(OPERATOR);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Runs" }).waitFor();

    const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
    const { runId } = await ingress.submitMessage({ agentId: gatedAgent.id, conversationId: "dash-gate", actor: { id: "alice" }, messageId: "m-dash-gate", text: "Write and publish the notes", connector: "dash-test" });
    // "a" has run and the gate holds the graph: only a decision moves it on.
    const parked = await waitForRun(runId, (run) => run.waitReason === WaitReason.HUMAN_GATE);
    expect(parked.shape).toBe(ExecutionShape.GRAPH);

    await page.locator(`tr[data-run-id="${runId}"] a.run-link`).click();
    await page.getByRole("heading", { name: `Run ${runId}` }).waitFor();
    await page.getByTestId("work-graph").waitFor();
    await node("a").and(page.locator('[data-node-status="succeeded"]')).waitFor();
    await node("gate").and(page.locator('[data-node-status="blocked"]')).waitFor();
    expect(await node("b").getAttribute("data-node-status")).toBe("pending");
    await expect.poll(() => page.getByTestId("wait-reason").textContent()).toContain("human_gate");
    // Admitted order, kinds, inputs and objectives.
    const order = await Promise.all((await page.locator("li.graph-node").all()).map((row) => row.getAttribute("data-node-key")));
    expect(order).toEqual(["a", "gate", "b"]);
    expect(await node("gate").locator(".badge.kind").textContent()).toBe("human_gate");
    expect(await node("gate").locator(".node-deps").textContent()).toBe("after a");
    expect(await node("a").locator(".node-deps").textContent()).toBe("starts first");
    expect(await node("b").textContent()).toContain("Publish the approved release notes");
    expect(await page.getByTestId("graph-summary").textContent()).toContain("1 of 3 nodes done");
    const childA = node("a").locator("a.child-run");
    expect(await childA.count()).toBe(1);
    expect(await node("b").locator(".attempts").count()).toBe(0);

    expect(await node("gate").getByTestId("node-status").textContent()).toBe("awaiting decision");

    const form = node("gate").getByRole("form", { name: "decide gate gate" });
    await form.scrollIntoViewIfNeeded();
    await page.getByTestId("work-graph").screenshot({ path: path.join(SHOTS, "work-graph-gate.png") });
    await page.screenshot({ path: path.join(SHOTS, "work-graph-gate-page.png") });
    await page.emulateMedia({ colorScheme: "dark" });
    await page.getByTestId("work-graph").screenshot({ path: path.join(SHOTS, "work-graph-gate-dark.png") });
    await page.emulateMedia({ colorScheme: "light" });

    // Arrow keys walk the nodes.
    await node("a").focus();
    await page.keyboard.press("ArrowDown");
    expect(await page.evaluate('document.activeElement?.getAttribute("data-node-key")')).toBe("gate");
    await page.keyboard.press("ArrowUp");
    expect(await page.evaluate('document.activeElement?.getAttribute("data-node-key")')).toBe("a");

    // A decision needs a reason; the refusal is said and nothing is recorded.
    await form.getByRole("button", { name: "Approve" }).click();
    await expect.poll(() => form.getByRole("alert").textContent()).toContain("reason is required");
    expect((await runs().getWorkGraph({ runId })).graph?.nodes.find((n) => n.key === "gate")?.gateDecision).toBe(GateDecision.UNSPECIFIED);

    await form.getByLabel("Reason").fill(REASON);
    await form.getByRole("button", { name: "Approve" }).click();
    await expect.poll(() => node("gate").getByTestId("gate-decision").textContent(), { timeout: UI_TIMEOUT_MS }).toBe(`approved by ${OPERATOR}: ${REASON}`);
    await node("b").and(page.locator('[data-node-status="succeeded"]')).waitFor();
    await expect.poll(() => runStatus().textContent(), { timeout: UI_TIMEOUT_MS }).toBe("succeeded");
    await expect.poll(() => page.getByTestId("final-reply").textContent()).toBe(FINAL_REPLY);
    await page.locator('[data-graph-live="no"]').waitFor();
    expect(await page.getByTestId("graph-summary").textContent()).toContain("3 of 3 nodes done");
    await page.screenshot({ path: path.join(SHOTS, "work-graph-done.png"), fullPage: true });

    // The API and the ledger agree: the gate was approved by the signed-in operator, with the reason.
    const { graph } = await runs().getWorkGraph({ runId });
    const nodes = graph?.nodes ?? [];
    expect(nodes.map((n) => [n.key, n.status])).toEqual([
      ["a", WorkNodeStatus.SUCCEEDED],
      ["gate", WorkNodeStatus.SUCCEEDED],
      ["b", WorkNodeStatus.SUCCEEDED],
    ]);
    expect(nodes[1]).toMatchObject({ gateDecision: GateDecision.APPROVE, gateDecidedByActorId: OPERATOR, gateReason: REASON });
    const { rows } = await db.query<{ gate_decision: string; gate_decided_by_actor_id: string; gate_reason: string; decided: boolean }>(
      `SELECT n.gate_decision, n.gate_decided_by_actor_id, n.gate_reason, n.gate_decided_at IS NOT NULL AS decided
         FROM work_nodes n JOIN work_graphs g ON g.id = n.graph_id WHERE g.root_run_id = $1 AND n.key = 'gate'`,
      [runId],
    );
    expect(rows).toEqual([{ gate_decision: "approve", gate_decided_by_actor_id: OPERATOR, gate_reason: REASON, decided: true }]);
    // A contrary decision afterwards is refused and changes nothing.
    const other = await runs()
      .decideGate({ runId, gateId: "gate", actor: { id: "mallory" }, decision: GateDecision.REJECT, reason: "too late" })
      .then(() => undefined, (caught: unknown) => caught);
    expect(other).toBeInstanceOf(ConnectError);
    expect([Code.FailedPrecondition, Code.NotFound]).toContain((other as ConnectError).code);
    expect((await runs().getWorkGraph({ runId })).graph?.nodes[1]).toMatchObject({ gateDecision: GateDecision.APPROVE, gateDecidedByActorId: OPERATOR });

    // A node's attempt opens its child run, whose page shows the same graph with itself marked.
    const childB = nodes[2]?.attempts[0]?.childRunId ?? "";
    expect(childB).not.toBe("");
    await node("b").locator("a.child-run").click();
    await page.getByRole("heading", { name: `Run ${childB}` }).waitFor();
    await expect.poll(() => runStatus().textContent()).toBe("succeeded");
    await expect.poll(() => page.getByTestId("final-reply").textContent()).toBe("result of b");
    await expect.poll(() => node("b").locator(".attempts").textContent()).toContain("(this run)");
    expect(await node("gate").getByTestId("gate-decision").textContent()).toBe(`approved by ${OPERATOR}: ${REASON}`);
  });
});
