// The composition root and command line: reads the environment, parses flags, runs one command.
import { parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import { resolveToken, resolveUrl, clientTls } from "./cli/client.js";
import { AGENT_TLS_FLAGS, SERVE_TLS_FLAGS, agentTlsOptions, serveTlsSettings } from "./cli/tls-flags.js";
import { inspectCommand } from "./cli/inspect-command.js";
import { recoverListCommand, recoverResolveCommand } from "./cli/recover-command.js";
import { resumeCommand } from "./cli/resume-command.js";
import { gateCommand } from "./cli/gate-command.js";
import { hostsCommand } from "./cli/hosts-command.js";
import { runsCommand } from "./cli/runs-command.js";
import { sendCommand } from "./cli/send-command.js";
import { ConfigError, loadConfig } from "./config.js";
import { allowHeapGrowthForStreaming } from "./heap-growth.js";

const USAGE = `keel: a durable control plane for AI agent runs

  keel serve [--dev] [--port N] [--http1-port N] [--workers N] [--durability strict|relaxed]
        [--tls-cert F --tls-key F [--tls-client-ca F]] [--insecure]
  keel cert dev [--out DIR] [--host NAME]...
  keel health [--url U] [--ca F] [--service NAME]
  keel send --agent A --conversation C [--actor U] [--timeout-ms N] "text"
  keel runs [--agent A] [--conversation C] [--status S] [--limit N]
  keel inspect RUN_ID
  keel gate RUN_ID GATE approve|reject --reason R [--actor U]
  keel hosts
  keel resume RUN_ID [--reason R] [--actor U]
  keel recover
  keel recover RUN_ID --invocation ID --outcome applied|not_applied --reason R [--actor U]
  keel token create --role sandbox-host --host-id H [--max-capacity N] [--label k=v]... [--expires-in 30d]
  keel token create --role connector --connector NAME... [--agent ID]... [--expires-in 30d]
  keel token create --role operator|admin [--name L] [--expires-in 30d]
  keel token list | keel token revoke TOKEN_ID
  keel settings get | keel settings set [--root-run-ceiling N] [--retention-days N]
  keel gc [--older-than 30d] [--dry-run]
  keel gc [--older-than 30d] [--dry-run]
  keel replay RUN_ID | keel replay --all [--since 1d] [--limit N]
  keel sandbox-agent --control-plane URL[,URL...] --token T [--backend docker|process] [--host-id ID]
        [--capacity N] [--label k=v]... [--image I]... [--warm-pool N] [--disk-quota-mib N] [--data-dir D]
        [--allow-unsandboxed] [--ca F] [--tls-cert F --tls-key F] [--insecure]

\`keel sandbox-agent\` runs a sandbox host: it attaches to the control plane (token role
sandbox-host; KEEL_SANDBOX_TOKEN also works) and runs each run's workspace commands. The
process backend needs bubblewrap; --allow-unsandboxed runs its commands unsandboxed (unsafe).

\`keel replay\` re-runs recorded runs against the current code, policy and tools, with the
recorded model turns and tool results (nothing is executed or written), and prints where they
diverge; exit 1 on a divergence.

\`keel resume\` lifts an operator's pause. \`keel recover\` lists runs waiting on a write whose
outcome a stopped worker left unknown; with a run id it records what you found (applied or
not_applied, and why) so the run can go on. \`keel gate\` decides a WorkGraph's human gate
(by key or id). \`keel hosts\` lists the sandbox fleet. The actor defaults to $USER.

Client commands take --url (KEEL_URL, default http://127.0.0.1:7070) and --token
(KEEL_TOKEN, or the file .keel/dev-token that \`keel serve --dev\` writes); for an https:// URL
whose certificate is not from a system CA, KEEL_CA names the CA file. \`keel cert dev\` writes
a development CA, server and client certificates (README, "TLS").
Settings are environment variables (KEEL_PORT, DATABASE_URL, ...): see README.md. Settings every
replica must agree on live in the ledger: \`keel settings\` reads and changes them (admin token).`;

export async function main(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): Promise<number> {
  const out = (line: string) => process.stdout.write(`${line}\n`);
  const [command, ...rest] = argv;
  // `keel <command> --help` shows the usage instead of "unknown option".
  if (command !== undefined && (rest.includes("--help") || rest.includes("-h"))) {
    out(USAGE);
    return 0;
  }
  try {
    switch (command) {
      case "serve": {
        const { values } = parseArgs({
          args: rest,
          options: { dev: { type: "boolean" }, port: { type: "string" }, "http1-port": { type: "string" }, workers: { type: "string" }, durability: { type: "string" }, ...SERVE_TLS_FLAGS },
        });
        const config = loadConfig({
          ...env,
          ...(values.port === undefined ? {} : { KEEL_PORT: values.port }),
          ...(values["http1-port"] === undefined ? {} : { KEEL_HTTP1_PORT: values["http1-port"] }),
          ...(values.workers === undefined ? {} : { KEEL_WORKERS: values.workers }),
          ...(values.durability === undefined ? {} : { KEEL_DURABILITY: values.durability }),
          ...serveTlsSettings(values),
        });
        // The server side (ORM, embedded PostgreSQL, workers) loads only when needed: client commands start fast.
        const { serveCommand } = await import("./cli/serve-command.js");
        allowHeapGrowthForStreaming();
        return await serveCommand(config, env, values.dev ?? false);
      }
      case "send": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: {
            agent: { type: "string", default: "demo" },
            conversation: { type: "string", default: "cli" },
            actor: { type: "string", default: env["USER"] ?? "cli-user" },
            "timeout-ms": { type: "string", default: "120000" },
            url: { type: "string" },
            token: { type: "string" },
          },
        });
        const text = positionals.join(" ");
        if (text === "") return usage("send needs the message text");
        return await sendCommand(
          { url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) },
          { agent: values.agent, conversation: values.conversation, actor: values.actor, text, timeoutMs: Number(values["timeout-ms"]) },
          out,
        );
      }
      case "runs": {
        const { values } = parseArgs({
          args: rest,
          options: {
            agent: { type: "string" },
            conversation: { type: "string" },
            status: { type: "string" },
            limit: { type: "string", default: "20" },
            url: { type: "string" },
            token: { type: "string" },
          },
        });
        return await runsCommand(
          { url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) },
          {
            ...(values.agent === undefined ? {} : { agent: values.agent }),
            ...(values.conversation === undefined ? {} : { conversation: values.conversation }),
            ...(values.status === undefined ? {} : { status: values.status }),
            limit: Number(values.limit),
          },
          out,
        );
      }
      case "inspect": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: { url: { type: "string" }, token: { type: "string" } },
        });
        const [runId] = positionals;
        if (runId === undefined) return usage("inspect needs a run id");
        return await inspectCommand({ url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) }, runId, out);
      }
      case "gate": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: { reason: { type: "string", default: "" }, actor: { type: "string", default: env["USER"] ?? "cli-user" }, url: { type: "string" }, token: { type: "string" } },
        });
        const [runId, gate, decision] = positionals;
        if (runId === undefined || gate === undefined || (decision !== "approve" && decision !== "reject")) return usage("gate needs a run id, a gate, and approve or reject");
        if (values.reason.trim() === "") return usage("gate needs --reason: it is recorded with the decision");
        return await gateCommand(
          { url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) },
          { runId, gate, decision, actor: values.actor, reason: values.reason },
          out,
        );
      }
      case "hosts": {
        const { values } = parseArgs({ args: rest, options: { url: { type: "string" }, token: { type: "string" } } });
        return await hostsCommand({ url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) }, out);
      }
      case "resume": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: {
            reason: { type: "string", default: "resumed with keel resume" },
            actor: { type: "string", default: env["USER"] ?? "cli-user" },
            url: { type: "string" },
            token: { type: "string" },
          },
        });
        const [runId] = positionals;
        if (runId === undefined) return usage("resume needs a run id");
        return await resumeCommand(
          { url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) },
          { runId, actor: values.actor, reason: values.reason },
          out,
        );
      }
      case "recover": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: {
            invocation: { type: "string" },
            outcome: { type: "string" },
            reason: { type: "string", default: "" },
            actor: { type: "string", default: env["USER"] ?? "cli-user" },
            url: { type: "string" },
            token: { type: "string" },
          },
        });
        const client = { url: resolveUrl(values.url, env), token: resolveToken(values.token, env), ...clientTls(env) };
        const [runId] = positionals;
        if (runId === undefined) {
          if (values.invocation !== undefined || values.outcome !== undefined) return usage("recover --invocation/--outcome need a run id");
          return await recoverListCommand(client, out);
        }
        if (values.invocation === undefined || values.outcome === undefined) {
          return usage("recover RUN_ID needs --invocation ID --outcome applied|not_applied --reason R");
        }
        return await recoverResolveCommand(
          client,
          { runId, invocationId: values.invocation, outcome: values.outcome, actor: values.actor, reason: values.reason },
          out,
        );
      }
      case "token": {
        const { tokenCommand } = await import("./cli/token-command.js");
        return await tokenCommand(rest, () => loadConfig(env), out);
      }
      case "gc": {
        const { gcCommand } = await import("./cli/gc-command.js");
        return await gcCommand(rest, () => loadConfig(env), out);
      }
      case "gc": {
        const { gcCommand } = await import("./cli/gc-command.js");
        return await gcCommand(rest, () => loadConfig(env), out);
      }
      case "settings": {
        const { settingsCommand, SettingsUsageError } = await import("./cli/settings-command.js");
        try {
          return await settingsCommand(rest, env, out);
        } catch (error) {
          if (error instanceof SettingsUsageError) return usage(error.message);
          throw error;
        }
      }
      case "replay": {
        const { replayCommand } = await import("./cli/replay-command.js");
        return await replayCommand(rest, () => loadConfig(env), out, { env });
      }
      case "sandbox-agent": {
        const { values } = parseArgs({
          args: rest,
          options: {
            // Repeated or comma-separated: replicas of one control plane, any of which the host attaches to.
            "control-plane": { type: "string", multiple: true, default: [env["KEEL_URL"] ?? "http://127.0.0.1:7070"] },
            token: { type: "string", default: env["KEEL_SANDBOX_TOKEN"] ?? "" },
            backend: { type: "string", default: "docker" },
            "host-id": { type: "string" },
            capacity: { type: "string", default: "4" },
            label: { type: "string", multiple: true, default: [] },
            image: { type: "string", multiple: true, default: [] },
            "warm-pool": { type: "string", default: "0" },
            "disk-quota-mib": { type: "string", default: "8192" },
            "data-dir": { type: "string", default: env["KEEL_SANDBOX_DATA_DIR"] ?? ".keel-sandbox" },
            "allow-unsandboxed": { type: "boolean", default: false },
            ...AGENT_TLS_FLAGS,
          },
        });
        if (values.backend !== "docker" && values.backend !== "process") return usage("--backend must be docker or process");
        const { sandboxAgentCommand, SandboxAgentUsageError } = await import("../../sandbox-agent/src/sandbox-agent-command.js");
        allowHeapGrowthForStreaming();
        try {
          return await sandboxAgentCommand({
            controlPlaneUrl: values["control-plane"].join(","),
            token: values.token,
            backend: values.backend,
            hostId: values["host-id"],
            capacity: Number(values.capacity),
            labels: values.label,
            images: values.image,
            warmPool: Number(values["warm-pool"]),
            diskQuotaMib: Number(values["disk-quota-mib"]),
            dataDir: values["data-dir"],
            logLevel: loadConfig(env).logLevel,
            allowUnsandboxed: values["allow-unsandboxed"],
            tls: agentTlsOptions(values, env),
          });
        } catch (error) {
          if (error instanceof SandboxAgentUsageError) return usage(error.message);
          throw error;
        }
      }
      case "health": {
        const { healthCommand } = await import("./cli/health-command.js");
        return await healthCommand(rest, env, out);
      }
      case "cert": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: { out: { type: "string", default: ".keel/tls" }, host: { type: "string", multiple: true, default: [] } },
        });
        if (positionals[0] !== "dev") return usage("usage: keel cert dev [--out DIR] [--host NAME]...");
        const { certDevCommand } = await import("./cli/cert-command.js");
        return await certDevCommand(values.out, values.host, out);
      }
      case undefined:
      case "help":
      case "--help":
        out(USAGE);
        return command === undefined ? 2 : 0;
      default:
        return usage(`unknown command ${command}`);
    }
  } catch (error) {
    if (error instanceof ConfigError) process.stderr.write(`keel: ${error.message}\n`);
    else if (error instanceof ConnectError) process.stderr.write(`keel: ${error.rawMessage} (${codeName(error.code)})\n`);
    else if (error instanceof TypeError && "code" in error && String(error.code).startsWith("ERR_PARSE_ARGS")) return usage(error.message);
    else process.stderr.write(`keel: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  }
}

function usage(problem: string): number {
  process.stderr.write(`keel: ${problem}\n\n${USAGE}\n`);
  return 2;
}

function codeName(code: number): string {
  return ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied",
    "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss",
    "unauthenticated"][code] ?? String(code);
}
