// Dashboard benchmark (issue #15, acceptance line 2): how fast a run of 1,000 steps opens in the
// operator dashboard and how smoothly its timeline scrolls, in Debian's chromium driven by
// playwright-core, on a real Keel (embedded PostgreSQL, HTTP/1.1 listener as browsers use).
//
// The run is built as the browser test builds it (fixtures/long-run-agent.ts: one read per step
// until the iteration budget ends it). "Open" is the time from clicking the run in the runs table
// to its first timeline row being visible (first meaningful paint of the timeline), over several
// opens. Scrolling counts requestAnimationFrame gaps over 2 × 16.7 ms as dropped frames. Baselines,
// measured in the same run: the same RPCs the page makes, through the generated Connect client in
// Node over the same HTTP/1.1 port (the first page of steps, then all of them), and the browser's
// frame cadence on the same page with nothing moving.
//
//   npm run bench -- dashboard [--steps 1000] [--opens 5] [--scroll-px 120] [--trace FILE] [--durability strict|relaxed]
// (--trace writes a Chromium performance trace of the scroll, to open in chrome://tracing or Perfetto.)
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { chromium } from "playwright-core";
import { z } from "zod";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService, RunStepView } from "../gen/keel/v1/run_service_pb.js";
import { buildApp } from "../control-plane/src/app.js";
import { loadConfig } from "../control-plane/src/config.js";
import { longRunAgent } from "../control-plane/src/fixtures/long-run-agent.js";
import { defineTool } from "../control-plane/src/tools/tool-registry.js";
import { ensureDashboardBuilt } from "../dashboard/ensure-built.js";
import { benchDurability, DURABILITY_OPTION, integerOption, ms, pick, summarize, table, withBenchPostgres, type Durability } from "./support.js";

const READ_TOOL = "bench.read_path.v1";
const AGENT_ID = "bench-long";
const FRAME_MS = 1000 / 60;
const DROPPED_OVER_MS = 2 * FRAME_MS;
const BUILD_TIMEOUT_MS = 600_000;
const UI_TIMEOUT_MS = 60_000;

/** The read the long run asks for at every step (the tests' test.read_path, under the bench's name). */
const readPath = defineTool<{ path: string }>({
  name: "bench.read_path",
  version: 1,
  description: "Pretends to read a file at a path.",
  parameters: z.object({ path: z.string() }),
  effect: "read",
  execute: (args) => Promise.resolve({ ok: true, text: `contents of ${args.path}` }),
});

interface Options {
  readonly steps: number;
  readonly opens: number;
  readonly scrollPx: number;
  readonly trace: string | undefined;
  readonly durability: Durability;
}

function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: { steps: { type: "string", default: "1000" }, opens: { type: "string", default: "5" }, "scroll-px": { type: "string", default: "120" }, trace: { type: "string" }, ...DURABILITY_OPTION },
  });
  return {
    steps: integerOption("steps", values.steps, 2),
    opens: integerOption("opens", values.opens, 1),
    scrollPx: integerOption("scroll-px", values["scroll-px"], 1),
    trace: values.trace,
    durability: benchDurability(values.durability),
  };
}

function chromiumPath(): string {
  try {
    const found = execFileSync("sh", ["-c", "command -v chromium"], { encoding: "utf8" }).trim();
    if (found !== "") return found;
  } catch {
    // not installed
  }
  throw new Error("the dashboard bench needs Debian's chromium (apt-get install chromium)");
}

export default async function dashboard(args: readonly string[]): Promise<void> {
  const options = parseOptions(args);
  const progress = (line: string) => process.stderr.write(`[dashboard] ${line}\n`);
  const executablePath = chromiumPath();
  if ((await ensureDashboardBuilt()) === "built") progress("built the dashboard");

  await withBenchPostgres("dashboard", progress, async (postgres) => {
    const env = {
      DATABASE_URL: postgres.url,
      KEEL_LOG_LEVEL: "warn",
      ...pick(process.env, ["KEEL_WORKERS", "KEEL_DB_POOL_MAX", "KEEL_IDLE_POLL_MS", "KEEL_LEASE_MS"]),
      KEEL_DURABILITY: options.durability,
    };
    const app = await buildApp(loadConfig(env), env, { log: pino({ level: "warn" }, pino.destination(2)), tools: [readPath] });
    try {
      await app.agents.put(longRunAgent(AGENT_ID, options.steps, READ_TOOL));
      const operator = (await app.tokens.create("operator", "bench", { scope: { kind: "role" } })).secret;
      const connector = (await app.tokens.create("connector", "bench", { scope: { kind: "connector", connectors: "any", agents: "any" } })).secret;
      const { http1Url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
      app.startWorkers();
      const transport = (token: string) =>
        createConnectTransport({
          baseUrl: http1Url,
          httpVersion: "1.1",
          interceptors: [(next) => (request) => (request.header.set("authorization", `Bearer ${token}`), next(request))],
        });
      const runs = createClient(RunService, transport(operator));

      // The run, built by a real worker loop.
      const built = performance.now();
      const tag = randomUUID().slice(0, 8);
      const { runId } = await createClient(IngressService, transport(connector)).submitMessage({
        agentId: AGENT_ID,
        conversationId: `bench-${tag}`,
        actor: { id: "bench" },
        messageId: `m-${tag}`,
        text: "read it again and again",
        connector: "bench",
      });
      let stepCount = 0;
      for (let lastShown = 0; ; ) {
        const { run } = await runs.getRun({ runId });
        stepCount = run?.stepCount ?? 0;
        if (run !== undefined && run.status !== RunStatus.QUEUED && run.status !== RunStatus.RUNNING && run.status !== RunStatus.AWAITING_TOOL) {
          if (run.status !== RunStatus.BUDGET_EXHAUSTED) throw new Error(`the long run ended ${RunStatus[run.status]}, not BUDGET_EXHAUSTED: ${run.error}`);
          break;
        }
        if (performance.now() - built > BUILD_TIMEOUT_MS) throw new Error(`the long run did not finish within ${BUILD_TIMEOUT_MS} ms (${stepCount} steps)`);
        if (stepCount - lastShown >= 200) progress(`building the run: ${(lastShown = stepCount)} steps`);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      progress(`run ${runId}: ${stepCount} steps in ${ms(performance.now() - built)} ms`);

      // Baseline: what the page fetches, fetched from Node with the same generated client.
      const firstPage: number[] = [];
      const allSteps: number[] = [];
      for (let i = 0; i < options.opens; i++) {
        const started = performance.now();
        await Promise.all([runs.getRun({ runId }), runs.listArtifacts({ runId })]);
        // As the page asks: step summaries, 500 to a page.
        const list = (pageToken: string) => runs.listRunSteps({ runId, pageToken, pageSize: 500, view: RunStepView.SUMMARY });
        let page = await list("");
        firstPage.push(performance.now() - started);
        let fetched = page.steps.length;
        while (page.nextPageToken !== "") {
          page = await list(page.nextPageToken);
          fetched += page.steps.length;
        }
        allSteps.push(performance.now() - started);
        if (fetched !== stepCount) throw new Error(`ListRunSteps returned ${fetched} steps, the run has ${stepCount}`);
      }

      const browser = await chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
      try {
        const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
        page.setDefaultTimeout(UI_TIMEOUT_MS);
        await page.goto(`${http1Url}/`);
        await page.getByLabel("Operator token").fill(operator);
        await page.getByLabel(/Your name/).fill("bench");
        await page.getByRole("button", { name: "Sign in" }).click();
        await page.getByRole("heading", { name: "Runs" }).waitFor();

        const row = page.locator(`tr[data-run-id="${runId}"]`);
        const opens: number[] = [];
        const loads: number[] = [];
        for (let i = 0; i < options.opens; i++) {
          await page.goto(`${http1Url}/#/`);
          await row.waitFor();
          const started = performance.now();
          await row.locator("a.run-link").click();
          await page.locator("li.step").first().waitFor({ state: "visible" });
          opens.push(performance.now() - started);
          // Every step fetched: the timeline renders only the rows near the viewport, and counts all.
          // (A locator, not waitForFunction: the page's CSP forbids evaluating strings.)
          await page.locator(`ol.timeline[data-steps="${stepCount}"]`).waitFor({ state: "attached" });
          loads.push(performance.now() - started);
          progress(`open ${i + 1}/${options.opens}: first row ${ms(opens.at(-1)!)} ms, all ${stepCount} steps loaded ${ms(loads.at(-1)!)} ms`);
        }

        // Scroll the whole timeline at a steady pace, timing every frame (page script as a string:
        // this file is typed without the DOM library).
        await page.evaluate("window.scrollTo(0, 0)");
        // The browser's own frame cadence with nothing moving: the floor the scroll's gaps compare with.
        const idleGaps = JSON.parse(
          String(
            await page.evaluate(`new Promise((resolve) => {
              const gaps = [];
              let last;
              const frame = (now) => {
                if (last !== undefined) gaps.push(now - last);
                last = now;
                if (gaps.length >= 60) return resolve(JSON.stringify(gaps));
                requestAnimationFrame(frame);
              };
              requestAnimationFrame(frame);
            })`),
          ),
        ) as number[];
        if (options.trace !== undefined) await browser.startTracing(page, { path: options.trace, screenshots: false });
        const gaps = JSON.parse(
          String(
            await page.evaluate(`new Promise((resolve) => {
              const gaps = [];
              let last;
              const frame = (now) => {
                if (last !== undefined) gaps.push(now - last);
                last = now;
                if (window.scrollY + window.innerHeight >= document.documentElement.scrollHeight - 2) return resolve(JSON.stringify(gaps));
                window.scrollBy(0, ${options.scrollPx});
                requestAnimationFrame(frame);
              };
              requestAnimationFrame(frame);
            })`),
          ),
        ) as number[];
        if (options.trace !== undefined) {
          await browser.stopTracing();
          progress(`wrote a trace of the scroll to ${options.trace}`);
        }
        const dropped = gaps.filter((gap) => gap > DROPPED_OVER_MS).length;
        const idleDropped = idleGaps.filter((gap) => gap > DROPPED_OVER_MS).length;
        const scroll = summarize(gaps);
        const idle = summarize(idleGaps);

        const open = summarize(opens);
        const load = summarize(loads);
        const fetchFirst = summarize(firstPage);
        const fetchAll = summarize(allSteps);
        const row3 = (name: string, s: { n: number; p50: number; p99: number }) => [name, String(s.n), ms(s.p50), ms(s.p99)];
        const lines = [
          "",
          `Dashboard, a run of ${stepCount} steps (chromium headless, 1280×800; the run page loads every step as a summary, 500 to a page); Keel durability=${options.durability}`,
          "",
          ...table(
            ["measure", "n", "p50 ms", "p99 ms"],
            [
              row3("open: click → first timeline row visible", open),
              row3("open: click → all steps loaded", load),
              row3("baseline: Connect fetch in Node, first page", fetchFirst),
              row3("baseline: Connect fetch in Node, all steps", fetchAll),
              row3(`scroll: frame gap (${options.scrollPx} px a frame)`, scroll),
              row3("baseline: frame gap with nothing moving", idle),
            ],
          ),
          "",
          `scroll: ${gaps.length} frames, ${dropped} dropped (gap > ${ms(DROPPED_OVER_MS)} ms), longest ${ms(Math.max(0, ...gaps))} ms; idle: ${idleGaps.length} frames, ${idleDropped} dropped`,
          `open vs its data: ${ms(open.p50 - fetchFirst.p50)} ms of p50 is the page's own (render, and the browser's fetches)`,
          "",
          `RESULT mode=${options.durability} run_${options.steps}_steps_open_ms=${Math.round(open.p50)} dropped_frames=${dropped} scroll_frames=${gaps.length} idle_frame_ms=${ms(idle.p50)} idle_dropped_frames=${idleDropped} open_p99_ms=${Math.round(open.p99)} all_rows_ms=${Math.round(load.p50)} baseline_first_page_ms=${Math.round(fetchFirst.p50)} baseline_all_steps_ms=${Math.round(fetchAll.p50)}`,
        ];
        process.stdout.write(`${lines.join("\n")}\n`);
      } finally {
        await browser.close();
      }
    } finally {
      await app.stop();
    }
  });
}
