// Issue #12, item 10: PutAgent refuses numbers past their SQL types and sane ranges, secrets
// read from variables outside the allow-listed prefixes, and model endpoints off the allow-list,
// each with InvalidArgument naming the field, and stores nothing; an admin may accept an unlisted
// endpoint explicitly.
import { Code, ConnectError } from "@connectrpc/connect";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentSpecSchema, type AgentSpec } from "../gen/keel/v1/agent_pb.js";
import { AgentService } from "../gen/keel/v1/agent_service_pb.js";
import { ALLOW_UNLISTED_ENDPOINT_HEADER } from "../control-plane/src/api/agent-service.js";
import { connectClient, grpcClient } from "./support/clients.js";
import { startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const openai = (endpoint: string, apiKeyEnv = "") => ({ provider: "openai", model: "m", endpoint, apiKeyEnv });

function spec(id: string, fields: MessageInitShape<typeof AgentSpecSchema> = {}): AgentSpec {
  const agent = create(AgentSpecSchema, fields);
  agent.id = id;
  return agent;
}

describe("agent spec bounds (issue #12, item 10)", () => {
  let keel: TestKeel;

  beforeAll(async () => {
    keel = await startTestKeel({
      workers: 0,
      agents: [],
      env: { KEEL_MODEL_ENDPOINTS: "https://models.example.com/v1", KEEL_SECRET_ENV_PREFIXES: "KEEL_SECRET_,ACME_KEY_" },
    });
  });

  afterAll(async () => {
    await keel?.stop();
  });

  /** The agent's id if a row for it exists. */
  const stored = async (id: string): Promise<string | undefined> => {
    const client = new pg.Client({ connectionString: keel.databaseUrl });
    await client.connect();
    try {
      const { rows } = await client.query<{ id: string }>("SELECT id FROM agents WHERE id = $1", [id]);
      return rows[0]?.id;
    } finally {
      await client.end();
    }
  };

  const refused: [string, AgentSpec, string][] = [
    ["max_concurrent_root_runs past uint32's use", spec("b-runs", { maxConcurrentRootRuns: 4294967295 }), "agent.max_concurrent_root_runs"],
    ["max_concurrent_root_runs past the sane range", spec("b-runs2", { maxConcurrentRootRuns: 10_001 }), "agent.max_concurrent_root_runs"],
    ["a budget past its range", spec("b-budget", { budget: { maxCostMicroUsd: 18446744073709551615n } }), "agent.budget.max_cost_micro_usd"],
    ["a wall clock past a week", spec("b-wall", { budget: { maxWallClockMs: 4294967295 } }), "agent.budget.max_wall_clock_ms"],
    ["a coalesce window past an hour", spec("b-window", { interrupt: { coalesceWindowMs: 4294967295 } }), "agent.interrupt.coalesce_window_ms"],
    ["a graph ceiling past its range", spec("b-graph", { graph: { maxNodes: 4294967295 } }), "agent.graph.max_nodes"],
    ["a model timeout past an hour", spec("b-timeout", { models: { primary: { provider: "scripted", timeoutMs: 4294967295 } } }), "agent.models.primary.timeout_ms"],
    [
      "scripted tokens past an int column",
      spec("b-tokens", { models: { primary: { provider: "scripted", scriptedTurns: [{ replyText: "x", inputTokens: 4294967295 }] } } }),
      "agent.models.primary.scripted_turns[0].input_tokens",
    ],
    ["an API key from DATABASE_URL", spec("b-key", { models: { primary: openai("https://models.example.com/v1", "DATABASE_URL") } }), "agent.models.primary.api_key_env"],
    [
      "a workspace secret from DATABASE_URL",
      spec("b-secret", { sandbox: { secrets: [{ envVar: "DB", sourceEnv: "DATABASE_URL" }] } }),
      "agent.sandbox.secrets[0].source_env",
    ],
    ["an unlisted endpoint", spec("b-endpoint", { models: { primary: openai("https://evil.example.net/v1") } }), "agent.models.primary.endpoint"],
    ["a listed host on another path", spec("b-path", { models: { primary: openai("https://models.example.com/v10") } }), "agent.models.primary.endpoint"],
    ["an endpoint with credentials", spec("b-cred", { models: { primary: openai("https://u:p@models.example.com/v1") } }), "agent.models.primary.endpoint"],
    ["an unlisted fast model", spec("b-fast", { models: { fast: openai("http://10.0.0.1/v1") } }), "agent.models.fast.endpoint"],
  ];

  for (const [what, agent, field] of refused) {
    it(`refuses ${what}: InvalidArgument naming ${field}, nothing stored`, async () => {
      const admin = connectClient(AgentService, keel.url, keel.tokens.admin);
      const error = await admin.putAgent({ agent }).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(error?.code).toBe(Code.InvalidArgument);
      expect(error?.rawMessage).toContain(field);
      expect(await stored(agent.id)).toBeUndefined();
    });
  }

  it("accepts specs within bounds, listed endpoints, allowed prefixes, and loopback on a loopback server (grpc-js wire)", async () => {
    const admin = grpcClient(AgentService, keel.url, keel.tokens.admin);
    await admin.putAgent({
      agent: spec("b-ok", {
        maxConcurrentRootRuns: 10_000,
        budget: { maxWallClockMs: 7 * 24 * 3_600_000, maxCostMicroUsd: 1_000_000_000_000n },
        models: { primary: openai("https://models.example.com/v1/", "KEEL_SECRET_OPENAI"), fast: openai("http://127.0.0.1:9/v1", "ACME_KEY_1") },
        sandbox: { secrets: [{ envVar: "TOKEN", sourceEnv: "KEEL_SECRET_TOKEN" }] },
      }),
    });
    expect(await stored("b-ok")).toBe("b-ok");
    const back = (await admin.getAgent({ agentId: "b-ok" })).agent;
    expect(back?.maxConcurrentRootRuns).toBe(10_000);
    expect(back?.models?.fast?.endpoint).toBe("http://127.0.0.1:9/v1");
  });

  it("accepts an unlisted endpoint when the admin asks for it explicitly", async () => {
    const admin = connectClient(AgentService, keel.url, keel.tokens.admin);
    const agent = spec("b-explicit", { models: { primary: openai("https://elsewhere.example.org/v1", "KEEL_SECRET_OPENAI") } });
    await expect(admin.putAgent({ agent })).rejects.toMatchObject({ code: Code.InvalidArgument });
    await admin.putAgent({ agent }, { headers: { [ALLOW_UNLISTED_ENDPOINT_HEADER]: "true" } });
    expect(await stored("b-explicit")).toBe("b-explicit");
    // The flag opens endpoints only: secret variables stay on their prefixes.
    const key = spec("b-explicit-key", { models: { primary: openai("https://elsewhere.example.org/v1", "HOME") } });
    await expect(admin.putAgent({ agent: key }, { headers: { [ALLOW_UNLISTED_ENDPOINT_HEADER]: "true" } })).rejects.toMatchObject({
      code: Code.InvalidArgument,
    });
  });
});
