// The Python connector (connectors/python) against a real Keel: stubs generated from proto/ with
// protoc at test time, then a real python3 process that submits, follows its cursor, acknowledges
// and answers. Skips with a reason when python3-grpcio is absent; KEEL_REQUIRE_PYTHON=1 fails instead.
import { execFile, spawnSync } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliveryStatus, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { scriptedAgent, scriptedTurn, toolCall } from "../control-plane/src/fixtures/scripted-model.js";
import { connectClient } from "./support/clients.js";
import { ROOT } from "./support/child-processes.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const run = promisify(execFile);
const CONNECTOR = path.join(ROOT, "connectors", "python", "keel_connector.py");
const GENERATE = path.join(ROOT, "connectors", "python", "generate.sh");
const REQUIRED = process.env["KEEL_REQUIRE_PYTHON"] === "1";

/** A python3 that has grpcio and protobuf (Debian's lives in /usr/bin when pyenv shadows it). */
const python = ["python3", "/usr/bin/python3"].find((candidate) => spawnSync(candidate, ["-c", "import grpc, google.protobuf"]).status === 0);
if (python === undefined && !REQUIRED) console.log("skipping the Python connector test: no python3 with grpcio (apt install python3-grpcio protobuf-compiler protobuf-compiler-grpc)");

interface Line {
  submitted?: string;
  emission?: Record<string, unknown>;
  skipped?: Record<string, unknown>;
  answered?: string;
}

describe.skipIf(python === undefined && !REQUIRED)("the Python connector", () => {
  let keel: TestKeel;
  let dir: string;
  let stubs: string;
  /** A connector token bound to this connector's name and these agents only, as a deployment would make. */
  let pythonToken: string;
  const stateFile = () => path.join(dir, "state.json");

  beforeAll(async () => {
    if (python === undefined) throw new Error("KEEL_REQUIRE_PYTHON=1 but no python3 with grpcio is installed");
    dir = await mkdtemp(path.join(tmpdir(), "keel-python-"));
    stubs = path.join(dir, "stubs");
    await run("bash", [GENERATE, stubs], { env: { ...process.env, PYTHON: python } });
    keel = await startTestKeel({
      agents: [DEMO_AGENT, scriptedAgent("asker", [scriptedTurn("", [toolCall("keel.ask_user.v1", { question: "Which colour?" })]), scriptedTurn("Painted it.")])],
    });
    const scope = { kind: "connector", connectors: ["py-conn"], agents: ["demo", "asker"] } as const;
    pythonToken = (await keel.app.tokens.create("connector", "python", { scope })).secret;
  });
  afterAll(async () => {
    await keel.stop();
    await rm(dir, { recursive: true, force: true });
  });

  /** Runs the connector to its exit; its output as parsed JSON lines. */
  async function connector(args: readonly string[]): Promise<Line[]> {
    const { stdout } = await run(
      python ?? "python3",
      [CONNECTOR, "--target", new URL(keel.url).host, "--stubs", stubs, "--connector", "py-conn", "--state-file", stateFile(), "--actor", "alice", ...args],
      { env: { ...process.env, KEEL_TOKEN: pythonToken }, timeout: 30_000 },
    );
    return stdout.trim().split("\n").map((line) => JSON.parse(line) as Line);
  }

  const emitted = (lines: Line[]) => lines.flatMap((line) => (line.emission === undefined ? [] : [line.emission]));
  const text = (emission: Record<string, unknown>, field: string) => {
    const value = emission[field];
    return typeof value === "string" ? value : "";
  };
  const cursor = async () => (JSON.parse(await readFile(stateFile(), "utf8")) as { after_seq: number }).after_seq;

  async function held(count: number): Promise<Emission[]> {
    const abort = new AbortController();
    const seen: Emission[] = [];
    try {
      for await (const { emission } of connectClient(EmissionService, keel.url, keel.tokens.admin).subscribe({ connector: "py-conn" }, { signal: abort.signal, timeoutMs: 15_000 })) {
        if (emission !== undefined) seen.push(emission);
        if (seen.length === count) abort.abort();
      }
    } catch (error) {
      if (!abort.signal.aborted) throw error;
    }
    return seen;
  }

  it("submits, acknowledges each emission, answers the question and stops at the final ack", async () => {
    const lines = await connector(["--agent", "asker", "--answer", "blue", "paint the fence"]);
    const runId = lines[0]?.submitted;
    expect(runId).toMatch(/^[0-9a-f-]{36}$/);
    const kinds = emitted(lines).map((emission) => `${text(emission, "kind")} ${text(emission, "ack_state")}`.trim());
    // Started and thinking come once per request, however many model calls the question splits it into.
    expect(kinds).toEqual([
      "EMISSION_KIND_ACK ACK_STATE_WORKING",
      "EMISSION_KIND_ACK ACK_STATE_STARTED",
      "EMISSION_KIND_ACK ACK_STATE_THINKING",
      "EMISSION_KIND_QUESTION",
      "EMISSION_KIND_REPLY",
      "EMISSION_KIND_ACK ACK_STATE_SUCCEEDED",
    ]);
    expect(lines.some((line) => line.answered === runId)).toBe(true);
    expect(emitted(lines)[4]?.["text"]).toBe("Painted it.");

    const inKeel = await held(6);
    expect(inKeel.map((emission) => emission.deliveryStatus)).toEqual(Array(6).fill(DeliveryStatus.DELIVERED));
    expect(inKeel.map((emission) => emission.remoteRef)).toEqual(Array(6).fill("python-stdout"));
    expect(await cursor()).toBe(Number(inKeel[5]?.seq));
    const { steps } = await connectClient(RunService, keel.url, keel.tokens.operator).listRunSteps({ runId: runId ?? "" });
    expect(steps[0]?.toolInvocations[0]).toMatchObject({ toolName: "keel.ask_user.v1", resultText: "Answer from alice: blue" });
  });

  it("resumes from its cursor: the next session receives only what is new, each emission once", async () => {
    const before = await cursor();
    const lines = await connector(["--agent", "demo", "hello from python"]);
    const seqs = emitted(lines).map((emission) => Number(emission["seq"]));
    expect(seqs).toHaveLength(5);
    expect(seqs.every((seq) => seq > before)).toBe(true);
    expect(lines.filter((line) => line.skipped !== undefined)).toEqual([]);
    expect(emitted(lines)[3]?.["text"]).toBe("Hello from Keel. You said: hello from python");
    const all = await held(11);
    expect(new Set(all.map((emission) => emission.id)).size).toBe(11);
  });

  it("after a rewind to zero, delivers nothing again: every settled emission is skipped", async () => {
    await rm(stateFile());
    const lines = await connector(["--follow-seconds", "3"]);
    expect(emitted(lines)).toEqual([]);
    expect(lines.filter((line) => line.skipped !== undefined)).toHaveLength(11);
    expect((await held(11)).map((emission) => emission.deliveryStatus)).toEqual(Array(11).fill(DeliveryStatus.DELIVERED));
  });

  it("is refused outside its token's scope: another connector name", async () => {
    const refused = connector(["--connector", "someone-else", "--agent", "demo", "hi"]);
    await expect(refused).rejects.toMatchObject({ stderr: expect.stringContaining("PERMISSION_DENIED") as unknown });
  });
});
