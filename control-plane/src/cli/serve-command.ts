import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { buildApp } from "../app.js";
import type { TlsMaterial } from "../api/server.js";
import type { KeelConfig, TlsFiles } from "../config.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { DEV_TOKEN_FILE } from "./client.js";

/** Serves until SIGINT/SIGTERM. With `dev`, also provides the demo agent and an admin token file for the CLI. */
export async function serveCommand(config: KeelConfig, env: Readonly<Record<string, string | undefined>>, dev: boolean): Promise<number> {
  // Read the certificate files first: a wrong path fails before the database starts.
  const tls = config.tls === undefined ? undefined : await readTls(config.tls);
  const app = await buildApp(config, env);
  const log = app.log;
  if (dev) {
    if ((await app.agents.get(DEMO_AGENT.id)) === undefined) await app.agents.put(DEMO_AGENT);
    const tokenFile = path.join(config.dataDir, DEV_TOKEN_FILE);
    if (!existsSync(tokenFile)) {
      const { secret } = await app.tokens.create("admin", "dev");
      await mkdir(config.dataDir, { recursive: true });
      await writeFile(tokenFile, `${secret}\n`, { mode: 0o600 });
    }
    log.info({ tokenFile, agent: DEMO_AGENT.id }, "dev mode: demo agent ready; the CLI reads the admin token from the token file");
  }
  let listening: { url: string; http1Url: string };
  try {
    listening = await app.server.listen({
      host: config.host,
      port: config.port,
      http1Port: config.http1Port,
      insecure: config.insecure,
      ...(tls === undefined ? {} : { tls }),
    });
  } catch (error) {
    await app.stop();
    const { code, address, port } = error as { code?: string; address?: string; port?: number };
    if (code === "EADDRINUSE") {
      throw new Error(
        `${address ?? config.host}:${port ?? "?"} is already in use (another keel serve?): choose other ports with --port and --http1-port (KEEL_PORT, KEEL_HTTP1_PORT)`,
      );
    }
    throw error;
  }
  const { url, http1Url } = listening;
  app.startWorkers();
  if (tls === undefined && config.insecure) log.warn({ host: config.host }, "serving plaintext off loopback (--insecure): tokens cross the network unencrypted");
  log.info(
    {
      url,
      http1Url,
      workers: config.workers,
      durability: config.durability,
      database: config.databaseUrl === undefined ? "embedded" : "external",
      tls: tls === undefined ? "off" : tls.clientCa === undefined ? "on" : "on, sandbox hosts need client certificates",
    },
    "keel is serving (gRPC, gRPC-Web and Connect on url; Connect JSON over HTTP/1.1 on http1Url)",
  );

  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      log.info({ signal }, "stopping");
      resolve();
    };
    process.once("SIGINT", () => stop("SIGINT"));
    process.once("SIGTERM", () => stop("SIGTERM"));
  });
  await app.stop();
  return 0;
}

async function readTls(files: TlsFiles): Promise<TlsMaterial> {
  const read = async (setting: string, file: string) => {
    try {
      return await readFile(file);
    } catch (error) {
      throw new Error(`${setting}: cannot read ${file}: ${error instanceof Error ? error.message : String(error)}`);
    }
  };
  const [cert, key, clientCa] = await Promise.all([
    read("--tls-cert", files.certFile),
    read("--tls-key", files.keyFile),
    files.clientCaFile === undefined ? undefined : read("--tls-client-ca", files.clientCaFile),
  ]);
  return { cert, key, ...(clientCa === undefined ? {} : { clientCa }) };
}
