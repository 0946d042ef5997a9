// The CLI chat driven through a real pseudo-terminal (python3's pty module) against a real Keel:
// what a person at the terminal sees, in order, and that answering a question reaches the run.
import { spawn, spawnSync } from "node:child_process";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scriptedAgent, scriptedModel, scriptedTurn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { connectClient } from "./support/clients.js";
import { ROOT, waitFor } from "./support/child-processes.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const CHAT = path.join(ROOT, "connectors", "cli-chat", "main.ts");
// Runs the command on the slave side of a new pty and relays both ways (stdin may be a pipe).
const PTY_RELAY = "import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)";
const hasPython = spawnSync("python3", ["-c", "import pty"]).status === 0;
if (!hasPython && process.env["KEEL_REQUIRE_PYTHON"] !== "1") console.log("skipping the CLI chat pty test: python3 with its pty module is not installed");

let keel: TestKeel;
beforeAll(async () => {
  keel = await startTestKeel({
    agents: [
      DEMO_AGENT,
      scriptedAgent("asker", [scriptedTurn("", [toolCall("keel.ask_user.v1", { question: "Which colour?" })]), scriptedTurn("Painted it.")]),
      // A long run: its one model call takes 3 s, and its cadence asks for a notice after 300 ms of silence.
      {
        ...scriptedAgent("slowpoke", [scriptedTurn("Finally done: {{message}}", [], { delayMs: 3_000 })]),
        models: {
          primary: scriptedModel([scriptedTurn("Finally done: {{message}}", [], { delayMs: 3_000 })]),
          fast: scriptedModel([scriptedTurn(JSON.stringify({ duration: "default", shape: "loop", ack_text: null }))]),
          decision: scriptedModel([scriptedTurn("unclear")]),
        },
        progress: { firstAfterMs: 300, everyMs: 60_000 },
      },
    ],
    progress: { tickMs: 20 },
  });
});
afterAll(() => keel.stop());

interface Terminal {
  /** Everything the terminal showed so far, escape sequences removed. */
  screen(): string;
  type(line: string): void;
  exited: Promise<number | null>;
}

function openChat(agent: string): Terminal {
  const child = spawn("python3", ["-c", PTY_RELAY, process.execPath, "--import", "tsx", CHAT, "--url", keel.url, "--agent", agent, "--actor", "alice"], {
    cwd: ROOT,
    env: { ...process.env, KEEL_TOKEN: keel.tokens.connector, TERM: "xterm" },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let raw = "";
  child.stdout.on("data", (chunk: Buffer) => (raw += chunk.toString("utf8")));
  child.stderr.on("data", (chunk: Buffer) => (raw += chunk.toString("utf8")));
  return {
    screen: () => raw.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, "").replace(/\r/g, ""),
    type: (line) => child.stdin.write(`${line}\r`),
    exited: new Promise((resolve) => child.once("exit", (code) => resolve(code))),
  };
}

const shows = (terminal: Terminal, pattern: RegExp) => waitFor(`the terminal to show ${String(pattern)}`, async () => (pattern.test(terminal.screen()) ? true : undefined), 20_000);

describe.skipIf(!hasPython && process.env["KEEL_REQUIRE_PYTHON"] !== "1")("cli-chat in a pseudo-terminal", () => {
  it("shows ⏳, the reply, then ✅ for each line, and leaves on /quit", async () => {
    const terminal = openChat("demo");
    await shows(terminal, /chatting with demo/);
    terminal.type("hi there");
    await shows(terminal, /✅ succeeded/);
    const screen = terminal.screen();
    const working = screen.indexOf("⏳ working");
    const reply = screen.indexOf("keel: Hello from Keel. You said: hi there");
    const done = screen.indexOf("✅ succeeded");
    expect(working).toBeGreaterThanOrEqual(0);
    expect(reply).toBeGreaterThan(working);
    expect(done).toBeGreaterThan(reply);
    terminal.type("/quit");
    expect(await terminal.exited).toBe(0);
  });

  it("shows a question, sends the next line as its answer, then the reply", async () => {
    const terminal = openChat("asker");
    await shows(terminal, /chatting with asker/);
    terminal.type("paint the shed");
    await shows(terminal, /❓ Which colour\?/);
    terminal.type("blue");
    await shows(terminal, /✅ succeeded/);
    const screen = terminal.screen();
    expect(screen).toMatch(/answered run/);
    const order = ["⏳ working", "❓ Which colour?", "keel: Painted it.", "✅ succeeded"].map((text) => screen.indexOf(text));
    expect(order.every((at) => at >= 0)).toBe(true);
    expect([...order].sort((a, b) => a - b)).toEqual(order);
    const runId = /answered run ([0-9a-f]{8})/.exec(screen)?.[1] ?? "";
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const run = (await runs.listRuns({ agentId: "asker", pageSize: 10 })).runs.find((candidate) => candidate.id.startsWith(runId));
    expect(run?.status).toBe(RunStatus.SUCCEEDED);
    const { steps } = await runs.listRunSteps({ runId: run?.id ?? "" });
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ toolName: "keel.ask_user.v1", resultText: "Answer from alice: blue" });
    terminal.type("/quit");
    expect(await terminal.exited).toBe(0);
  });
  it("shows a long run's ⏳ → 👀 → 🧠, a progress notice, the reply, then ✅", async () => {
    const terminal = openChat("slowpoke");
    await shows(terminal, /chatting with slowpoke/);
    terminal.type("rebuild the index");
    await shows(terminal, /✅ succeeded/);
    const screen = terminal.screen();
    const at = (text: string) => screen.indexOf(text);
    const [working, started, thinking, notice, reply, done] = ["⏳ working", "👀 started", "🧠 thinking", "… Still on it", "keel: Finally done: rebuild the index", "✅ succeeded"].map(at);
    expect([working, started, thinking, notice, reply, done].every((i) => (i ?? -1) >= 0), screen).toBe(true);
    // The reactions in lifecycle order; the notice comes while the run works (beside 🧠, whichever committed first).
    expect(working).toBeLessThan(started ?? -1);
    expect(started).toBeLessThan(thinking ?? -1);
    expect(started).toBeLessThan(notice ?? -1);
    expect(thinking).toBeLessThan(reply ?? -1);
    expect(notice).toBeLessThan(reply ?? -1);
    expect(reply).toBeLessThan(done ?? -1);
    // The notice arrives once, and nothing follows the reply but the settled ack.
    expect(screen.split("… ").length - 1).toBe(1);
    terminal.type("/quit");
    expect(await terminal.exited).toBe(0);
  });
});
