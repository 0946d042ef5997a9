// Restate as a peer: restate-server from npm, started here on free ports with a temporary base
// folder (fsync of its logs on for strict, off for relaxed), and a restate-sdk endpoint in this
// process whose handler makes two ctx.run per iteration (the model turn, then the read tool).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http2 from "node:http2";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { freePort, type Durability } from "../support.js";
import { polyfillPromiseWithResolvers, type Peer, type PeerKind } from "./peer.js";

const listeners = new Map<string, () => void>();

/**
 * The server's settings per mode. relaxed turns off the fsync of the two RocksDB write-ahead logs
 * an invocation's journal passes through (the local log store and the log server of the default
 * replicated loglet); the partition store's WAL fsync is already off by default.
 */
function restateConfig(durability: Durability, baseDir: string): string {
  const fsyncOff = durability === "relaxed";
  return [
    `base-dir = ${JSON.stringify(baseDir)}`,
    "disable-telemetry = true",
    'log-filter = "error"',
    "",
    "[bifrost.local]",
    `rocksdb-disable-wal-fsync = ${String(fsyncOff)}`,
    "",
    "[log-server]",
    `rocksdb-disable-wal-fsync = ${String(fsyncOff)}`,
    "",
  ].join("\n");
}

function serverBinary(): string {
  const require = createRequire(import.meta.url);
  const pkg = require.resolve(`@restatedev/restate-server-${process.platform}-${process.arch === "x64" ? "x64" : "arm64"}/package.json`);
  return path.join(path.dirname(pkg), "bin", "restate-server");
}

async function waitUntil(what: string, check: () => Promise<boolean>, child: ChildProcess, output: string[], timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`restate-server exited (${String(child.exitCode)}) before ${what}: ${output.slice(-5).join(" | ")}`);
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`restate-server: timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** The in-process service endpoint, shared by both modes' servers; closeRestateEndpoint ends it. */
let endpoint: { server: http2.Http2Server; port: number; sessions: Set<http2.ServerHttp2Session> } | undefined;

export async function closeRestateEndpoint(): Promise<void> {
  const closing = endpoint;
  endpoint = undefined;
  if (closing === undefined) return;
  // close() waits for every session to end; the servers that opened them are gone by now.
  const closed = new Promise<void>((resolve) => closing.server.close(() => resolve()));
  for (const session of closing.sessions) session.destroy();
  await closed;
}

export function restatePeer(): PeerKind {
  return {
    name: "restate",
    describe: (durability) => `restate-server 1.7.12 + restate-sdk 1.16.9, log fsync ${durability === "strict" ? "on (default)" : "off"}`,
    async start(durability: Durability, iterations: number): Promise<Peer> {
      polyfillPromiseWithResolvers();
      // The SDK logs every invocation's start and end at INFO; the bench prints its own progress.
      process.env["RESTATE_LOGGING"] ??= "WARN";
      const restate = await import("@restatedev/restate-sdk");
      if (endpoint === undefined) {
        const loop = restate.service({
          name: "keelPeersLoop",
          handlers: {
            run: async (ctx: import("@restatedev/restate-sdk").Context, request: { loopId: string; iterations: number }) => {
              for (let i = 0; i < request.iterations; i++) {
                listeners.get(request.loopId)?.();
                const turn = await ctx.run("model", () => ({ toolCalls: [{ name: "bench.read.v1", arguments: { key: "k" } }] }));
                await ctx.run("tool", () => `value of ${turn.toolCalls[0]?.arguments.key ?? "?"}: 42`);
              }
              return request.iterations;
            },
          },
        });
        const server = http2.createServer(restate.createEndpointHandler({ services: [loop] }));
        const sessions = new Set<http2.ServerHttp2Session>();
        server.on("session", (session) => {
          sessions.add(session);
          session.once("close", () => sessions.delete(session));
        });
        const port = await freePort();
        await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
        endpoint = { server, port, sessions };
      }
      const endpointPort = endpoint.port;
      const dir = await mkdtemp(path.join(tmpdir(), `keel-bench-restate-${durability}-`));
      const [ingressPort, adminPort, nodePort] = [await freePort(), await freePort(), await freePort()];
      const config = path.join(dir, "restate.toml");
      await writeFile(config, restateConfig(durability, path.join(dir, "base")));
      const output: string[] = [];
      const child = spawn(serverBinary(), ["--config-file", config, "--no-logo"], {
        env: {
          ...process.env,
          RESTATE_INGRESS__BIND_ADDRESS: `127.0.0.1:${ingressPort}`,
          RESTATE_ADMIN__BIND_ADDRESS: `127.0.0.1:${adminPort}`,
          RESTATE_BIND_ADDRESS: `127.0.0.1:${nodePort}`,
          RESTATE_ADVERTISED_ADDRESS: `http://127.0.0.1:${nodePort}`,
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      child.stdout?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
      child.stderr?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
      const stop = async () => {
        if (child.exitCode === null) {
          const exited = new Promise((resolve) => child.once("exit", resolve));
          child.kill("SIGTERM");
          let timer: NodeJS.Timeout | undefined;
          await Promise.race([exited, new Promise((resolve) => (timer = setTimeout(resolve, 10_000)))]);
          clearTimeout(timer);
          if (child.exitCode === null) child.kill("SIGKILL");
        }
        await rm(dir, { recursive: true, force: true });
      };
      const admin = `http://127.0.0.1:${adminPort}`;
      const ingress = `http://127.0.0.1:${ingressPort}`;
      /** One loop, answered when the handler returned (every ctx.run journaled before it). */
      const call = async (loopId: string) => {
        const response = await fetch(`${ingress}/keelPeersLoop/run`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ loopId, iterations }),
        });
        if (!response.ok) throw new Error(`restate ingress answered ${response.status}: ${await response.text()}`);
        await response.arrayBuffer();
      };
      try {
        await waitUntil("the admin API", async () => (await fetch(`${admin}/health`)).ok, child, output);
        await waitUntil(
          "the deployment to register",
          async () =>
            (
              await fetch(`${admin}/deployments`, {
                method: "POST",
                headers: { "content-type": "application/json" },
                body: JSON.stringify({ uri: `http://127.0.0.1:${endpointPort}`, force: true }),
              })
            ).ok,
          child,
          output,
        );
        // The ingress learns of the service a moment after registration; a loop of 1 proves it.
        await waitUntil("the ingress to route to the service", async () => (await call("probe"), true), child, output);
      } catch (error) {
        await stop();
        throw error;
      }
      let loops = 0;
      return {
        async runLoop(iterationStarted) {
          const loopId = `${durability}-${loops++}-${Date.now()}`;
          listeners.set(loopId, iterationStarted);
          try {
            await call(loopId);
          } finally {
            listeners.delete(loopId);
          }
        },
        stop,
      };
    },
  };
}
