// One chaos replica: `node --import tsx bench/chaos/chaos-serve.ts`. It composes Keel as
// `keel serve` does (buildApp, listen, workers, stop on SIGTERM) and adds the one tool a
// deployment of the chaos workload brings, chaos.post_effect (KEEL_CHAOS_EFFECT_URL). Keel has
// no HTTP-call tool of its own, and sandboxes reach no host service (bubblewrap unshares the
// network; Docker workspaces are firewalled off the host), so the external write is this tool.
// Prints `LISTENING <url>` once it serves.
import { buildApp } from "../../control-plane/src/app.js";
import { loadConfig } from "../../control-plane/src/config.js";
import { allowHeapGrowthForStreaming } from "../../control-plane/src/heap-growth.js";
import { createEffectTool } from "./effect-tool.js";

async function main(): Promise<void> {
  allowHeapGrowthForStreaming();
  const env = process.env;
  const effectUrl = env["KEEL_CHAOS_EFFECT_URL"];
  if (effectUrl === undefined || effectUrl === "") throw new Error("chaos-serve: KEEL_CHAOS_EFFECT_URL is required");
  const config = loadConfig(env);
  const app = await buildApp(config, env, { tools: [createEffectTool(effectUrl)] });
  const { url } = await app.server.listen({ host: config.host, port: config.port, http1Port: config.http1Port });
  app.log.info({ url, workers: config.workers }, "keel is serving (chaos replica)");
  process.stdout.write(`LISTENING ${url}\n`);
  app.startWorkers();
  await new Promise<void>((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
  await app.stop();
}

main().catch((error: unknown) => {
  process.stderr.write(`chaos-serve: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
