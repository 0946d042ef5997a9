// What the dashboard's browser tests share: finding Debian's chromium (a test skips, saying why,
// when it is absent, and fails instead when KEEL_REQUIRE_BROWSER=1), opening a page on it, where
// screenshots go, and waiting on a run through the API.
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { RunStatus, WaitReason, type Run } from "../../gen/keel/v1/run_pb.js";
import { RunService } from "../../gen/keel/v1/run_service_pb.js";
import { ensureDashboardBuilt } from "../../dashboard/ensure-built.js";
import { ROOT } from "./child-processes.js";
import { connectClient } from "./clients.js";

export const REQUIRE_BROWSER = process.env["KEEL_REQUIRE_BROWSER"] === "1";
export const CHROMIUM: string | undefined = (() => {
  try {
    return execFileSync("sh", ["-c", "command -v chromium"], { encoding: "utf8" }).trim() || undefined;
  } catch {
    return undefined;
  }
})();
/** Whether a browser test skips; when it does, it says why once. */
export function skipsWithoutBrowser(what: string): boolean {
  const skips = CHROMIUM === undefined && !REQUIRE_BROWSER;
  if (skips) console.log(`skipping ${what}: Debian's chromium is not installed (apt-get install chromium)`);
  return skips;
}

export const SHOTS = path.join(ROOT, "test-output", "dashboard");
/** Generous: the whole suite shares two cores. */
export const UI_TIMEOUT_MS = 30_000;

/** Builds the dashboard if needed, starts headless chromium and opens a page of this size. */
export async function openBrowser(viewport: { width: number; height: number }): Promise<{ browser: Browser; page: Page }> {
  if (CHROMIUM === undefined) throw new Error("KEEL_REQUIRE_BROWSER=1 but chromium is not installed");
  mkdirSync(SHOTS, { recursive: true });
  await ensureDashboardBuilt();
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
  const page = await browser.newPage({ viewport });
  page.setDefaultTimeout(UI_TIMEOUT_MS);
  return { browser, page };
}

/** Polls GetRun until `done` holds, failing with the run's last status and wait reason. */
export async function waitForRun(url: string, token: string, runId: string, done: (run: Run) => boolean, timeoutMs = UI_TIMEOUT_MS): Promise<Run> {
  const runs = connectClient(RunService, url, token);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { run } = await runs.getRun({ runId });
    if (run !== undefined && done(run)) return run;
    if (Date.now() > deadline) throw new Error(`run ${runId} never reached the expected state (last: ${RunStatus[run?.status ?? 0]}, waiting on ${WaitReason[run?.waitReason ?? 0]})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
