// Issue #12 item 12: output an exec produced while the agent had no connection and that went past
// its buffer was dropped, yet the exec's result said nothing was cut. Now the result says truncated.
import { create } from "@bufbuild/protobuf";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { WorkspaceCommandSchema } from "../../gen/keel/v1/sandbox_service_pb.js";
import type { OutputOutlet } from "./output-batcher.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceBackend } from "./workspace-backend.js";
import { createWorkspaceCommands, type RequestInit } from "./workspace-commands.js";

/** A backend whose every exec writes three chunks of output and exits 0. */
const chattyBackend = (): WorkspaceBackend =>
  ({
    name: "process",
    exec: async (_workspaceId, _request, onOutput) => {
      for (const text of ["one\n", "two\n", "three\n"]) {
        onOutput("stdout", Buffer.from(text));
        await new Promise((resolve) => setImmediate(resolve));
      }
      return { exitCode: 0, durationMs: 1, timedOut: false, outputTruncated: false };
    },
  }) as Partial<WorkspaceBackend> as WorkspaceBackend;

async function runExec(dropOutput: (text: string) => boolean) {
  const sent: RequestInit[] = [];
  const send = (init: RequestInit): boolean => {
    if (init.message?.case === "output" && dropOutput(Buffer.from(init.message.value.chunk ?? []).toString())) return false;
    sent.push(init);
    return true;
  };
  const outlet = (commandId: string): OutputOutlet => ({
    send: (stream, chunk) => send({ message: { case: "output", value: { commandId, chunk } } }),
    maxChunkBytes: 4,
    transportWaiting: true,
    holding: () => {},
  });
  const commands = createWorkspaceCommands({
    backend: chattyBackend(),
    limits: DEFAULT_WORKSPACE_LIMITS,
    log: pino({ level: "silent" }),
    stopping: new AbortController().signal,
    workspaces: new Map(),
    send,
    outlet,
    finished: () => {},
    outputBacklog: () => undefined,
  });
  await commands.handle(create(WorkspaceCommandSchema, { commandId: "c1", action: { case: "exec", value: { workspaceId: "w1", argv: ["x"] } } }));
  const result = sent.find((r) => r.message?.case === "result");
  return result?.message?.case === "result" ? result.message.value : undefined;
}

describe("exec output dropped while disconnected", () => {
  it("marks the exec's result truncated when any of its output was dropped", async () => {
    const result = await runExec((text) => text.startsWith("two"));
    expect(result?.ok).toBe(true);
    expect(result?.outputTruncated).toBe(true);
  });

  it("leaves a result whose output all went out untruncated", async () => {
    const result = await runExec(() => false);
    expect(result?.outputTruncated).toBe(false);
  });
});
