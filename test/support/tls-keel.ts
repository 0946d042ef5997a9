// A real Keel listening the way a deployment does (TLS, HTTP/2 limits from the environment),
// for the transport tests: its own database, no workers, a token per role.
import { pino } from "pino";
import { buildApp, type KeelApp } from "../../control-plane/src/app.js";
import type { TlsMaterial } from "../../control-plane/src/api/server.js";
import { loadConfig } from "../../control-plane/src/config.js";
import type { TokenRole } from "../../control-plane/src/ledger/api-token.repository.js";
import { createTestDatabase } from "./keel-fixture.js";

export interface ListeningKeel {
  readonly app: KeelApp;
  readonly url: string;
  readonly http1Url: string;
  readonly tokens: Readonly<Record<TokenRole, string>>;
  stop(): Promise<void>;
}

export async function startListeningKeel(options: { readonly tls?: TlsMaterial; readonly env?: Readonly<Record<string, string>> } = {}): Promise<ListeningKeel> {
  const env = { DATABASE_URL: await createTestDatabase(), KEEL_WORKERS: "0", KEEL_DB_POOL_MAX: "10", ...options.env };
  const app = await buildApp(loadConfig(env), env, { log: pino({ level: process.env["KEEL_TEST_LOG"] ?? "silent" }) });
  const roles: TokenRole[] = ["connector", "sandbox-host", "operator", "admin"];
  const tokens = Object.fromEntries(await Promise.all(roles.map(async (role) => [role, (await app.tokens.create(role, "test")).secret] as const))) as Record<TokenRole, string>;
  const { url, http1Url } = await app.server.listen({ host: "127.0.0.1", port: 0, http1Port: 0, ...(options.tls === undefined ? {} : { tls: options.tls }) });
  return { app, url, http1Url, tokens, stop: () => app.stop() };
}
