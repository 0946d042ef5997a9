// The Slack connector assembled: Slack's SocketModeClient receives events (no public URL needed),
// a WebClient with the bot token posts and reacts, and both directions share one state file.
import { LogLevel, SocketModeClient } from "@slack/socket-mode";
import { keelClients } from "../shared/keel-client.js";
import { createInbound, type InboundEvent, type SlackMessage } from "./inbound.js";
import { runOutbound, type OutboundEvent } from "./outbound.js";
import { slackWebClient } from "./slack-call.js";
import { StateStore } from "./state.js";

export interface SlackConnectorOptions {
  readonly keelUrl: string;
  readonly keelToken: string;
  readonly agentId: string;
  /** The connector name Keel routes this app's emissions to. */
  readonly connector: string;
  /** App-level token (xapp-…), for apps.connections.open. */
  readonly appToken: string;
  /** Bot token (xoxb-…), for posting and reacting. */
  readonly botToken: string;
  /** The Web API base; Slack's own by default. */
  readonly slackApiUrl?: string;
  readonly stateFile: string;
  /** Per Web API call; a post that times out after sending is AMBIGUOUS. */
  readonly callTimeoutMs?: number;
  /** How long the client waits for a pong before reconnecting (Slack's default 5 s). */
  readonly clientPingTimeoutMs?: number;
  readonly backoffMs?: number;
  readonly onEvent?: (event: ConnectorEvent) => void;
}

export type ConnectorEvent =
  | ({ readonly direction: "in" } & InboundEvent)
  | ({ readonly direction: "out" } & OutboundEvent)
  | { readonly direction: "socket"; readonly type: "connected" | "disconnected" | "reconnecting"; readonly detail?: string };

export interface RunningConnector {
  readonly botUserId: string;
  stop(): Promise<void>;
}

export async function startSlackConnector(options: SlackConnectorOptions): Promise<RunningConnector> {
  const emit = options.onEvent ?? (() => undefined);
  const clients = keelClients(options.keelUrl, options.keelToken);
  const state = new StateStore(options.stateFile);
  const slackApiUrl = options.slackApiUrl === undefined ? {} : { slackApiUrl: options.slackApiUrl };
  const web = slackWebClient({ token: options.botToken, ...slackApiUrl, timeoutMs: options.callTimeoutMs ?? 10_000 });
  const identity = await web.auth.test();
  const botUserId = identity.user_id;
  if (botUserId === undefined) throw new Error("auth.test did not name the bot user");

  const inbound = createInbound({ ingress: clients.ingress, state, agentId: options.agentId, connector: options.connector, botUserId, onEvent: (event) => emit({ direction: "in", ...event }) });
  const socket = new SocketModeClient({
    appToken: options.appToken,
    logLevel: LogLevel.ERROR,
    clientPingTimeout: options.clientPingTimeoutMs ?? 5_000,
    clientOptions: slackApiUrl,
  });
  const onEnvelope = ({ event, ack }: { event: SlackMessage; ack: () => Promise<void> }) => {
    void inbound.handle(event).then(async (acknowledge) => {
      if (acknowledge) await ack().catch(() => undefined);
    });
  };
  socket.on("app_mention", onEnvelope);
  socket.on("message", onEnvelope);
  socket.on("connected", () => emit({ direction: "socket", type: "connected" }));
  socket.on("reconnecting", () => emit({ direction: "socket", type: "reconnecting" }));
  socket.on("disconnected", (error?: Error) => emit({ direction: "socket", type: "disconnected", ...(error === undefined ? {} : { detail: error.message }) }));
  await socket.start();

  const abort = new AbortController();
  const outbound = runOutbound(
    { emissions: clients.emissions, web, connector: options.connector, state, ...(options.backoffMs === undefined ? {} : { backoffMs: options.backoffMs }), onEvent: (event) => emit({ direction: "out", ...event }) },
    abort.signal,
  );
  return {
    botUserId,
    async stop() {
      abort.abort();
      await outbound;
      await socket.disconnect();
    },
  };
}
