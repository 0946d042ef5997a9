// The webhook connector as a program: `node --import tsx connectors/webhook/main.ts`, configured
// from the environment (see README.md beside this file). Ctrl-C stops both directions.
import { createServer } from "node:http";
import { keelClients } from "../shared/keel-client.js";
import { createInboundHandler } from "./inbound.js";
import { runOutbound } from "./outbound.js";

function env(name: string, fallback?: string): string {
  const value = process.env[name] ?? fallback;
  if (value === undefined || value === "") {
    process.stderr.write(`webhook: set ${name}\n`);
    process.exit(2);
  }
  return value;
}

const clients = keelClients(env("KEEL_URL", "http://127.0.0.1:7070"), env("KEEL_TOKEN"));
const connector = env("WEBHOOK_CONNECTOR", "webhook");
const abort = new AbortController();
const log = (entry: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(entry)}\n`);

const server = createServer(
  createInboundHandler({ ingress: clients.ingress, secret: env("WEBHOOK_IN_SECRET"), agentId: env("KEEL_AGENT", "demo"), connector }),
);
server.listen(Number(env("WEBHOOK_PORT", "8787")), env("WEBHOOK_HOST", "127.0.0.1"), () => {
  const address = server.address();
  log({ msg: "webhook listening", port: typeof address === "object" && address !== null ? address.port : undefined });
});

const outUrl = process.env["WEBHOOK_OUT_URL"];
const outbound =
  outUrl === undefined || outUrl === ""
    ? Promise.resolve()
    : runOutbound(
        {
          emissions: clients.emissions,
          connector,
          targetUrl: outUrl,
          secret: env("WEBHOOK_OUT_SECRET"),
          stateFile: env("WEBHOOK_STATE_FILE", "webhook-state.json"),
          timeoutMs: Number(env("WEBHOOK_OUT_TIMEOUT_MS", "10000")),
          onEvent: (event) => log({ msg: event.type, ...event }),
        },
        abort.signal,
      );

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    abort.abort();
    server.close();
    void outbound.then(() => process.exit(0));
  });
}
