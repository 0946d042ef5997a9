// A real Keel for integration tests: its own database on the shared PostgreSQL, a real
// HTTP/2 server on loopback, and a token per role.
import { randomBytes } from "node:crypto";
import pg from "pg";
import { pino, type Logger } from "pino";
import { inject } from "vitest";
import { buildApp, type BuildOptions, type KeelApp } from "../../control-plane/src/app.js";
import { loadConfig } from "../../control-plane/src/config.js";
import type { AgentSpec } from "../../control-plane/src/domain/agent.js";
import type { Clock } from "../../control-plane/src/domain/clock.js";
import type { ToolDefinition } from "../../control-plane/src/tools/tool-registry.js";
import type { ProgressOptions } from "../../control-plane/src/progress/progress-supervisor.js";
import type { TokenRole } from "../../control-plane/src/ledger/api-token.repository.js";
import { DEFAULT_HOST_CAPACITY, type TokenScope } from "../../control-plane/src/domain/token-scope.js";
import { DEMO_AGENT } from "../../control-plane/src/fixtures/demo-agent.js";

/** A fresh, empty database on the shared test PostgreSQL; returns its URL. */
export async function createTestDatabase(): Promise<string> {
  const base = inject("postgresUrl");
  const name = `keel_test_${randomBytes(6).toString("hex")}`;
  const client = new pg.Client({ connectionString: base });
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${name}`);
  } finally {
    await client.end();
  }
  const url = new URL(base);
  url.pathname = `/${name}`;
  return url.toString();
}

export interface TestKeel {
  readonly app: KeelApp;
  readonly url: string;
  readonly http1Url: string;
  readonly databaseUrl: string;
  /**
   * A secret per role: the connector's acts for any connector (as tokens from before scopes do),
   * the sandbox host's is bound to host CONTRACT_HOST_ID.
   */
  readonly tokens: Readonly<Record<TokenRole, string>>;
  /** A sandbox-host token bound to `hostId`, allowing these labels and at most `maxCapacity` workspaces. */
  hostToken(hostId: string, options?: { labels?: Record<string, string>; maxCapacity?: number }): Promise<string>;
  stop(): Promise<void>;
}

export interface TestKeelOptions {
  readonly databaseUrl?: string;
  readonly workers?: number;
  readonly env?: Readonly<Record<string, string>>;
  readonly agents?: readonly AgentSpec[];
  readonly tools?: readonly ToolDefinition[];
  /** Where Keel logs (default: silent, or KEEL_TEST_LOG's level). */
  readonly log?: Logger;
  /** The clock coalescing and admission read (default: the system clock). */
  readonly clock?: Clock;
  /** The progress supervisors' cadence and tick (default: the server's). */
  readonly progress?: ProgressOptions;
  /** Wraps the workers' dependencies (a test's model provider, fault injection). */
  readonly wrapRunnerDeps?: BuildOptions["wrapRunnerDeps"];
}

export async function startTestKeel(options: TestKeelOptions = {}): Promise<TestKeel> {
  const databaseUrl = options.databaseUrl ?? (await createTestDatabase());
  const env = {
    DATABASE_URL: databaseUrl,
    KEEL_WORKERS: String(options.workers ?? 2),
    KEEL_IDLE_POLL_MS: "500",
    KEEL_LEASE_MS: "3000",
    KEEL_DB_POOL_MAX: "10",
    ...options.env,
  };
  const app = await buildApp(loadConfig(env), env, {
    log: options.log ?? pino({ level: process.env["KEEL_TEST_LOG"] ?? "silent" }),
    ...(options.tools === undefined ? {} : { tools: options.tools }),
    ...(options.clock === undefined ? {} : { clock: options.clock }),
    ...(options.progress === undefined ? {} : { progress: options.progress }),
    ...(options.wrapRunnerDeps === undefined ? {} : { wrapRunnerDeps: options.wrapRunnerDeps }),
  });
  for (const agent of options.agents ?? [DEMO_AGENT]) await app.agents.put(agent);
  const roles: TokenRole[] = ["connector", "sandbox-host", "operator", "admin"];
  const tokens = Object.fromEntries(
    await Promise.all(roles.map(async (role) => [role, (await app.tokens.create(role, "test", { scope: fixtureScope(role) })).secret] as const)),
  ) as Record<TokenRole, string>;
  const hostToken = async (hostId: string, options: { labels?: Record<string, string>; maxCapacity?: number } = {}) =>
    (
      await app.tokens.create("sandbox-host", hostId, {
        scope: { kind: "sandbox-host", hostId, maxCapacity: options.maxCapacity ?? DEFAULT_HOST_CAPACITY, labels: options.labels ?? {} },
      })
    ).secret;
  const { url, http1Url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0 });
  if ((options.workers ?? 2) > 0) app.startWorkers();
  return { app, url, http1Url, databaseUrl, tokens, hostToken, stop: () => app.stop() };
}

/** The host the fixture's sandbox-host token is bound to (the contract suite registers as it). */
export const CONTRACT_HOST_ID = "contract-host";

function fixtureScope(role: TokenRole): TokenScope {
  switch (role) {
    case "connector":
      return { kind: "connector", connectors: "any", agents: "any" };
    case "sandbox-host":
      return { kind: "sandbox-host", hostId: CONTRACT_HOST_ID, maxCapacity: DEFAULT_HOST_CAPACITY, labels: {} };
    case "operator":
    case "admin":
      return { kind: "role" };
  }
}
