// One real PostgreSQL for the whole integration run; each test file makes its own database.
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgres } from "../../control-plane/src/ledger/embedded-postgres.js";

declare module "vitest" {
  export interface ProvidedContext {
    postgresUrl: string;
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0));
    });
  });
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = await mkdtemp(path.join(tmpdir(), "keel-test-pg-"));
  await chmod(dir, 0o755); // PostgreSQL runs as its own user when the tests run as root
  const postgres = await startEmbeddedPostgres({
    dataDir: path.join(dir, "data"),
    port: await freePort(),
    // A throwaway cluster: durability flags off for speed. Crash tests kill Keel, not Postgres.
    postgresFlags: ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=300"],
  });
  project.provide("postgresUrl", postgres.url);
  return async () => {
    await postgres.stop();
    await rm(dir, { recursive: true, force: true });
  };
}
