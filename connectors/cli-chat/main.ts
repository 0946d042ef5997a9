// `node --import tsx connectors/cli-chat/main.ts [--agent demo] [--conversation ID] [--actor NAME]`
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { keelClients } from "../shared/keel-client.js";
import { runChat } from "./chat.js";

const { values } = parseArgs({
  options: {
    url: { type: "string", default: process.env["KEEL_URL"] ?? "http://127.0.0.1:7070" },
    token: { type: "string" },
    agent: { type: "string", default: "demo" },
    conversation: { type: "string", default: `chat-${randomBytes(4).toString("hex")}` },
    actor: { type: "string", default: process.env["USER"] ?? "me" },
    connector: { type: "string" },
  },
});

/** --token, KEEL_TOKEN, or the token `keel serve --dev` left in .keel/. */
function token(): string {
  const explicit = values.token ?? process.env["KEEL_TOKEN"];
  if (explicit !== undefined && explicit !== "") return explicit;
  const file = path.resolve(process.env["KEEL_DATA_DIR"] ?? ".keel", "dev-token");
  if (existsSync(file)) return readFileSync(file, "utf8").trim();
  process.stderr.write("cli-chat: pass --token or set KEEL_TOKEN (or run `keel serve --dev` here)\n");
  process.exit(2);
}

const code = await runChat({
  clients: keelClients(values.url, token()),
  agent: values.agent,
  conversation: values.conversation,
  actor: values.actor,
  // Its own stream per session unless told otherwise, so it shows only what answers this session.
  connector: values.connector ?? `cli-chat-${randomBytes(4).toString("hex")}`,
  input: process.stdin,
  output: process.stdout,
  terminal: process.stdin.isTTY,
});
process.exit(code);
