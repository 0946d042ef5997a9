// The dashboard's Sandbox hosts page (issue #15), end to end: a real Keel, Debian's chromium driven
// by playwright-core, and a real sandbox agent on Docker. Before any host attaches the page says how
// to attach one; then a run's exec holds a workspace on the host, and the page shows the host
// attached to this replica, its capacity and labels, "1 of 2 in use" and a link to the run; once
// the agent is gone it reads as detached, and a heartbeat over 30 s old as a warning. Every wait is
// on a DOM condition or a run state, never a fixed sleep. Skips with a reason when chromium (or
// Docker, for the attached part) is absent;
// KEEL_REQUIRE_BROWSER=1 / KEEL_REQUIRE_DOCKER=1 (CI) fail instead, as test/dashboard.test.ts does.
import { execFileSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus, type Run } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { scriptedAgent, scriptedTurn as turn, toolCall, toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { openBrowser, SHOTS, skipsWithoutBrowser, UI_TIMEOUT_MS, waitForRun as waitForRunState } from "./support/browser.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { containersOfHost, killAllChildren, removeContainersOfHost, startSandboxAgent, uniqueHostId, whyDockerIsUnavailable, type AgentProcess } from "./support/sandbox-support.js";

const SKIPS = skipsWithoutBrowser("the dashboard hosts browser test");
const NO_DOCKER = SKIPS ? undefined : whyDockerIsUnavailable();
const DOCKER_REQUIRED = process.env["KEEL_REQUIRE_DOCKER"] === "1";
if (NO_DOCKER !== undefined && !DOCKER_REQUIRED) console.log(`skipping the hosts page's attached-host check: ${NO_DOCKER}`);

const CAPACITY = 2;
/** Holds its workspace until the test creates /workspace/.go. */
const HOLD_EXEC = "touch /workspace/.started; while [ ! -e /workspace/.go ]; do sleep 0.1; done; echo released";

describe.skipIf(SKIPS)("the dashboard's Sandbox hosts page in chromium", () => {
  let keel: TestKeel;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 2,
      agents: [
        scriptedAgent("hosts-exec", [turn("", [toolCall("sandbox.exec.v1", { command: HOLD_EXEC })]), turn("the exec is done")], {
          tools: toolGrants(["sandbox.exec.v1"]),
        }),
      ],
    });
    ({ browser, page } = await openBrowser({ width: 1280, height: 560 }));
  });

  afterAll(async () => {
    await browser?.close();
    await killAllChildren();
    await keel?.stop();
  });

  const runs = () => connectClient(RunService, keel.url, keel.tokens.operator);

  const waitForRun = (runId: string, done: (run: Run) => boolean): Promise<Run> => waitForRunState(keel.url, keel.tokens.operator, runId, done, 60_000);

  it("says how to attach a host while none has, reached from the top bar", async () => {
    await page.goto(`${keel.http1Url}/`);
    await page.getByLabel("Operator token").fill(keel.tokens.operator);
    await page.getByLabel(/Your name/).fill("olivia");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Runs" }).waitFor();

    await page.getByRole("link", { name: "Sandbox hosts" }).click();
    await page.getByRole("heading", { name: "Sandbox hosts" }).waitFor();
    expect(page.url()).toMatch(/#\/hosts$/);
    const empty = page.getByTestId("hosts-empty");
    await empty.waitFor();
    expect(await empty.textContent()).toContain("keel sandbox-agent --control-plane");
    expect(await empty.textContent()).toContain("--role sandbox-host");
    await expect.poll(() => page.getByTestId("hosts-summary").textContent()).toContain("0 hosts · 0 attached");
    expect(await page.getByRole("alert").textContent()).toBe("");
    await page.screenshot({ path: path.join(SHOTS, "hosts-empty.png") });
  });

  it.skipIf(NO_DOCKER !== undefined && !DOCKER_REQUIRED)("shows an attached host, its capacity and the run holding a workspace", { timeout: 180_000 }, async () => {
    if (NO_DOCKER !== undefined) throw new Error(`KEEL_REQUIRE_DOCKER=1: ${NO_DOCKER}`);
    const hostId = uniqueHostId("dash-hosts");
    const dataDir = await mkdtemp(path.join(tmpdir(), "keel-dashboard-hosts-"));
    let agent: AgentProcess | undefined;
    try {
      const token = await keel.hostToken(hostId, { labels: { zone: "eu", disk: "ssd" }, maxCapacity: CAPACITY });
      agent = await startSandboxAgent({ url: keel.url, token, hostId, dataDir, capacity: CAPACITY, labels: ["zone=eu", "disk=ssd"] });
      const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
      const { runId } = await ingress.submitMessage({ agentId: "hosts-exec", conversationId: "hosts-1", actor: { id: "alice" }, messageId: "hosts-m1", text: "hold a workspace", connector: "dash-test" });
      await waitForRun(runId, (run) => run.status === RunStatus.AWAITING_TOOL);

      // The page polls: the row appears, attached, with the run's workspace counted and linked.
      const row = page.locator(`table.hosts tr[data-host-id="${hostId}"]`);
      await row.waitFor();
      await expect.poll(() => row.getByTestId("workspaces").textContent(), { timeout: 60_000 }).toContain(`1 of ${CAPACITY} in use`);
      const [view] = (await runs().listSandboxHosts({})).hosts.filter((h) => h.hostId === hostId);
      expect(view?.connected).toBe(true);
      expect(view?.replicaId).not.toBe("");
      expect(await row.getAttribute("data-attached")).toBe("yes");
      const attachment = await row.getByTestId("attachment").textContent();
      expect(attachment).toContain("attached");
      expect(attachment).toContain(`to ${view!.replicaId.slice(0, 8)}`);
      expect(await row.locator("[data-replica-id]").getAttribute("data-replica-id")).toBe(view!.replicaId);
      expect(await row.locator("td").first().textContent()).toBe(hostId);
      expect(await row.locator(".chip").allTextContents()).toEqual(["disk=ssd", "zone=eu"]);
      expect(await row.textContent()).toContain("docker");
      expect(await row.getByTestId("heartbeat").getAttribute("data-stale")).toBe("no");
      const link = row.locator("a.run-link");
      expect(await link.getAttribute("href")).toBe(`#/runs/${runId}`);
      expect(await link.textContent()).toBe(runId.slice(0, 8));
      await expect.poll(() => page.getByTestId("hosts-summary").textContent()).toContain(`1 host · 1 attached · 1 of ${CAPACITY} workspaces in use`);
      expect(await page.getByTestId("hosts-empty").count()).toBe(0);
      await page.screenshot({ path: path.join(SHOTS, "hosts.png") });
      await page.emulateMedia({ colorScheme: "dark" });
      await page.screenshot({ path: path.join(SHOTS, "hosts-dark.png") });
      await page.emulateMedia({ colorScheme: "light" });

      // Keyboard: the arrow keys reach the row, Tab its run link, Enter opens the run.
      await row.locator(".host-id").focus();
      await page.keyboard.press("ArrowDown");
      expect(await page.evaluate("document.activeElement?.textContent")).toBe(hostId);
      await page.keyboard.press("Tab");
      expect(await page.evaluate("document.activeElement?.getAttribute('href')")).toBe(`#/runs/${runId}`);
      await page.keyboard.press("Enter");
      await page.getByRole("heading", { name: `Run ${runId}` }).waitFor();

      // Let the exec finish, then stop the agent: back on the page the host reads as detached.
      await expect
        .poll(
          async () => {
            for (const id of containersOfHost(hostId, true)) {
              try {
                execFileSync("docker", ["exec", id, "sh", "-c", "test -e /workspace/.started && touch /workspace/.go || true"], { stdio: "ignore" });
              } catch {
                // a warm-pool container going away meanwhile; the next poll tries again
              }
            }
            return (await runs().getRun({ runId })).run?.status;
          },
          { timeout: 60_000, interval: 250 },
        )
        .toBe(RunStatus.SUCCEEDED);
      await agent.kill();
      await page.getByRole("link", { name: "Sandbox hosts" }).click();
      await expect.poll(() => row.getAttribute("data-attached"), { timeout: UI_TIMEOUT_MS }).toBe("no");
      expect(await row.getByTestId("attachment").textContent()).toContain("detached");

      // A heartbeat older than 30 s turns the warning colour (aged in the ledger rather than waited for).
      expect(await row.getByTestId("heartbeat").getAttribute("data-stale")).toBe("no");
      const db = new pg.Client({ connectionString: keel.databaseUrl });
      await db.connect();
      try {
        await db.query("UPDATE sandbox_hosts SET last_heartbeat_at = now() - interval '45 seconds' WHERE id = $1", [hostId]);
      } finally {
        await db.end();
      }
      await expect.poll(() => row.getByTestId("heartbeat").getAttribute("data-stale"), { timeout: UI_TIMEOUT_MS }).toBe("yes");
      // At least 45 s: "45s ago" up to a few minutes, however slow the machine.
      expect(await row.getByTestId("heartbeat").textContent()).toMatch(/^(4[5-9]s|5\ds|\dm) ago$/);
      expect(await row.getByTestId("heartbeat").getAttribute("class")).toContain("stale");
    } finally {
      await agent?.kill();
      removeContainersOfHost(hostId);
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
