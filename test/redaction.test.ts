// Issue #12, item 9: a run's granted secrets never reach a table, a log line or an emission,
// even when the model echoes them (reply text and tool-call arguments) and when a sandbox exec
// prints one right where the output cap cuts it. A real server, real PostgreSQL, the real
// openai SDK against a local OpenAI-compatible server, and a real sandbox host on Docker.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { EmissionKind, EmissionService, type Emission } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { agentSpecToProto } from "../control-plane/src/api/agent-spec-convert.js";
import type { AgentSpec, ModelSpec } from "../control-plane/src/domain/agent.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { toolGrants } from "../control-plane/src/fixtures/scripted-model.js";
import { createKeelLogger, secretValuesOf } from "../control-plane/src/logger.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { startOpenAiCompatibleServer, type OpenAiCompatibleServer } from "./support/openai-compatible-server.js";
import {
  CapturedLog,
  killAllChildren,
  removeContainersOfHost,
  skipWithoutDocker,
  startSandboxAgent,
  uniqueHostId,
  waitFor,
} from "./support/sandbox-support.js";

const SECRET = randomBytes(16).toString("hex");
const API_KEY = randomBytes(16).toString("hex");
const CAP = 1024;
const ECHOED = "given [redacted:TOKEN]\n";
/** Filler that puts the cap 12 characters into the secret the command prints after it. */
const FILLER = CAP - ECHOED.length - 12;

const skip = skipWithoutDocker("redaction everywhere");

describe.skipIf(skip)("redaction everywhere (issue #12, item 9)", () => {
  let keel: TestKeel;
  let server: OpenAiCompatibleServer;
  let dataDir: string;
  const keelLog = new CapturedLog();
  const hostId = uniqueHostId("redact");

  beforeAll(async () => {
    // The model echoes the secret in its text and in the exec's arguments, then in its reply.
    server = await startOpenAiCompatibleServer(
      (_request, index) =>
        index === 0
          ? {
              kind: "reply",
              text: `Checking with ${SECRET} now.`,
              toolCalls: [
                {
                  name: "sandbox__exec__v1",
                  arguments: JSON.stringify({
                    command: `echo given ${SECRET}; head -c ${FILLER} /dev/zero | tr '\\0' x; printf %s "$TOKEN"; echo " and more $TOKEN"`,
                  }),
                },
              ],
            }
          : { kind: "reply", text: `Done: TOKEN=${SECRET}, key=${API_KEY}.` },
      { apiKey: API_KEY },
    );
    const env = {
      KEEL_SECRET_CANARY: SECRET,
      KEEL_SECRET_OPENAI_KEY: API_KEY,
      KEEL_SANDBOX_MAX_OUTPUT_BYTES: String(CAP),
      KEEL_SANDBOX_KEEP_MS: "0",
      KEEL_SANDBOX_SWEEP_MS: "200",
    };
    const destination = { write: (line: string) => void keelLog.lines.push(...line.split("\n").filter((l) => l !== "")) };
    keel = await startTestKeel({
      workers: 2,
      agents: [],
      env,
      log: createKeelLogger({ level: "debug", secretValues: secretValuesOf(env, ["KEEL_SECRET_"]), destination }),
    });
    const model: ModelSpec = {
      provider: "openai",
      model: "test-model",
      endpoint: server.url,
      apiKeyEnv: "KEEL_SECRET_OPENAI_KEY",
      prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
      scriptedTurns: [],
      timeoutMs: 10_000,
    };
    const agent: AgentSpec = {
      ...DEMO_AGENT,
      id: "leaky",
      models: { primary: model, fast: model, decision: model },
      tools: toolGrants(["sandbox.exec.v1"]),
      sandbox: { ...DEMO_AGENT.sandbox, secrets: [{ envVar: "TOKEN", sourceEnv: "KEEL_SECRET_CANARY" }] },
    };
    // Through PutAgent: a loopback endpoint on a loopback server, secrets from KEEL_SECRET_ variables.
    await connectClient(AgentService, keel.url, keel.tokens.admin).putAgent({ agent: agentSpecToProto(agent) });
    dataDir = await mkdtemp(path.join(tmpdir(), "keel-redaction-"));
    await startSandboxAgent({ url: keel.url, token: await keel.hostToken(hostId), hostId, dataDir, capacity: 2 });
  });

  afterAll(async () => {
    await killAllChildren();
    await keel?.stop();
    await server?.close();
    removeContainersOfHost(hostId);
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  });

  /** Every text, varchar, json and jsonb value in the database that contains `needle`, as table.column. */
  async function tablesHolding(needle: string): Promise<string[]> {
    const db = new pg.Client({ connectionString: keel.databaseUrl });
    await db.connect();
    try {
      const { rows: columns } = await db.query<{ table_name: string; column_name: string }>(
        `SELECT c.table_name, c.column_name FROM information_schema.columns c
           JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'
          WHERE c.table_schema = 'public' AND c.data_type IN ('text', 'character varying', 'json', 'jsonb', 'ARRAY')`,
      );
      expect(columns.length).toBeGreaterThan(20);
      const found: string[] = [];
      for (const { table_name: table, column_name: column } of columns) {
        const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${table}" WHERE "${column}"::text LIKE $1`, [`%${needle}%`]);
        if (rows[0]!.n > 0) found.push(`${table}.${column}`);
      }
      return found;
    } finally {
      await db.end();
    }
  }

  it("keeps the secret and the API key out of every table, log line, emission and model request", async () => {
    const connector = `redaction-${randomBytes(3).toString("hex")}`;
    const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
    const seen: Emission[] = [];
    const abort = new AbortController();
    const subscribed = (async () => {
      for await (const { emission } of emissions.subscribe({ connector }, { signal: abort.signal })) {
        if (emission === undefined) continue;
        seen.push(emission);
        if (emission.kind === EmissionKind.REPLY) break;
      }
    })().catch((error: unknown) => {
      if (!abort.signal.aborted) throw error;
    });

    const { runId } = await connectClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
      agentId: "leaky",
      conversationId: `c-${connector}`,
      actor: { id: "tester" },
      messageId: `m-${connector}`,
      text: "check the token",
      connector,
    });
    const runs = connectClient(RunService, keel.url, keel.tokens.operator);
    const run = await waitFor(
      "the run to settle",
      async () => {
        const { run } = await runs.getRun({ runId });
        return run !== undefined && run.status !== RunStatus.RUNNING && run.status !== RunStatus.QUEUED && run.status !== RunStatus.AWAITING_TOOL ? run : undefined;
      },
      60_000,
    );
    expect(run.status, run.error).toBe(RunStatus.SUCCEEDED);
    expect(run.finalReply).toBe("Done: TOKEN=[redacted:TOKEN], key=[redacted:KEEL_SECRET_OPENAI_KEY].");
    await Promise.race([subscribed, new Promise((resolve) => setTimeout(resolve, 10_000))]);
    abort.abort();

    // The exec ran what the ledger holds (the echoed secret redacted) and was cut inside the printed secret.
    const { steps } = await runs.listRunSteps({ runId });
    expect(steps[0]?.modelCall?.responseText).toBe("Checking with [redacted:TOKEN] now.");
    const exec = steps.flatMap((s) => s.toolInvocations).find((i) => i.toolName === "sandbox.exec.v1")!;
    expect(exec.argumentsJson).toContain("echo given [redacted:TOKEN];");
    expect(exec.outputTruncated).toBe(true);
    const stdout = exec.observations.filter((o) => o.stream === "stdout").map((o) => o.text).join("");
    expect(stdout).toBe(`${ECHOED}${"x".repeat(FILLER)}`);
    expect(exec.resultText.endsWith("x".repeat(20))).toBe(true);

    // Nothing of either value anywhere: no table, no log line, no emission, no request to the model.
    const needles = [SECRET, API_KEY, SECRET.slice(0, 8), SECRET.slice(-8), API_KEY.slice(0, 8)];
    keel.app.log.info({ req: { headers: { authorization: `Bearer ${API_KEY}` } }, detail: `value ${SECRET}` }, `a message with ${SECRET}`);
    const emitted = JSON.stringify(seen, (_key, value: unknown) => (typeof value === "bigint" ? String(value) : value));
    expect(seen.some((e) => e.kind === EmissionKind.REPLY)).toBe(true);
    expect(emitted).toContain("[redacted:TOKEN]");
    const requests = JSON.stringify(server.requests);
    expect(requests).toContain("Checking with [redacted:TOKEN] now.");
    for (const needle of needles) {
      expect(await tablesHolding(needle), needle).toEqual([]);
      expect(keelLog.text()).not.toContain(needle);
      expect(emitted).not.toContain(needle);
      expect(requests).not.toContain(needle);
    }
    expect(keelLog.text()).toContain("a message with [redacted:secret]");
    expect(keelLog.text()).not.toContain("Bearer");
  });
});
