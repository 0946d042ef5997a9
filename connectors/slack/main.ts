// The Slack connector as a program: `node --import tsx connectors/slack/main.ts`, configured from the
// environment (see README.md beside this file). Ctrl-C or SIGTERM stops both directions.
import { startSlackConnector } from "./connector.js";

function env(name: string, fallback?: string): string {
  const value = process.env[name] ?? fallback;
  if (value === undefined || value === "") {
    process.stderr.write(`slack: set ${name}\n`);
    process.exit(2);
  }
  return value;
}

const log = (entry: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(entry)}\n`);
const apiUrl = process.env["SLACK_API_URL"];

const connector = await startSlackConnector({
  keelUrl: env("KEEL_URL", "http://127.0.0.1:7070"),
  keelToken: env("KEEL_TOKEN"),
  agentId: env("KEEL_AGENT", "demo"),
  connector: env("SLACK_CONNECTOR", "slack"),
  appToken: env("SLACK_APP_TOKEN"),
  botToken: env("SLACK_BOT_TOKEN"),
  ...(apiUrl === undefined || apiUrl === "" ? {} : { slackApiUrl: apiUrl }),
  stateFile: env("SLACK_STATE_FILE", "slack-state.json"),
  callTimeoutMs: Number(env("SLACK_CALL_TIMEOUT_MS", "10000")),
  onEvent: (event) => log({ msg: `${event.direction} ${event.type}`, ...event }),
});
log({ msg: "slack connected", bot_user_id: connector.botUserId });

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void connector.stop().then(() => process.exit(0));
  });
}
