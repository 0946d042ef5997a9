// How sandbox commands and their outcomes travel in relay records between replicas: JSON, with
// byte fields (a write's content, an outcome's data and output tail, output chunks) as base64.
import type { CommandOutcome, HostAction, HostCommand } from "./host-protocol.js";

export const b64 = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
export const unb64 = (text: unknown) => new Uint8Array(Buffer.from(typeof text === "string" ? text : "", "base64"));

/** An acquire travels without its secrets' values, only their sources' names (fleet-relay.ts). */
export function encodeCommand(command: HostCommand): Record<string, unknown> {
  const action =
    command.action.kind === "write_file"
      ? { ...command.action, content: b64(command.action.content) }
      : command.action.kind === "acquire"
        ? { ...command.action, env: {} }
        : command.action;
  return { commandId: command.commandId, action, ...(command.leaseEpoch === undefined ? {} : { leaseEpoch: command.leaseEpoch }) };
}

export function decodeCommand(body: Record<string, unknown>): HostCommand {
  const raw = body as { commandId: string; action: HostAction & { content?: unknown }; leaseEpoch?: number };
  const action = raw.action.kind === "write_file" ? { ...raw.action, content: unb64(raw.action.content) } : raw.action;
  return { commandId: raw.commandId, action, ...(raw.leaseEpoch === undefined ? {} : { leaseEpoch: raw.leaseEpoch }) };
}

export const encodeOutcome = (o: CommandOutcome): Record<string, unknown> => ({ ...o, data: b64(o.data), outputTail: b64(o.outputTail) });
export const decodeOutcome = (body: Record<string, unknown>): CommandOutcome => {
  const o = body as unknown as CommandOutcome;
  return { ...o, data: unb64(body["data"]), outputTail: unb64(body["outputTail"]) };
};

