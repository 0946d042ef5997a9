// Issue #12 (items 11, 12): what the hub keeps for commands nobody waits for is counted in bytes,
// output and results alike, and bounded in total; what is dropped is logged, and a later
// re-attach gets the command's outcome marked truncated instead of silently short output.
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import type { CommandOutcome, HostCommand, HostRegistration } from "./host-protocol.js";
import { createSandboxHub, type AttachedHost, type SandboxHub } from "./sandbox-hub.js";
import type { WorkspaceLeaseStore } from "./workspace-lease-store.js";

const WS = "11111111-1111-4111-8111-111111111111";

/** A ledger side that knows nothing: every host is new, no workspace is active. */
const emptyStore = (): WorkspaceLeaseStore => ({
  registerHost: async () => undefined,
  hostDisconnected: async () => {},
  heartbeat: async () => {},
  isHostConnected: async () => true,
  activeWorkspaceIdsOfHost: async () => [],
  markLost: async () => [],
  markLostIfDetached: async () => [],
  instanceAttachedElsewhere: async () => undefined,
  activeWorkspaceOfRun: async () => undefined,
  activeCountsByHost: async () => new Map(),
  createWorkspace: async () => {},
  finish: async () => false,
  dueForRelease: async () => [],
});

const registration: HostRegistration = {
  hostId: "host-a",
  instanceId: "i1",
  capacity: { workspaces: 2, cpuMillis: 1000, memoryBytes: 1 },
  labels: {},
  backends: ["docker"],
  images: [],
  running: [],
  agentVersion: "test",
};

const outcome = (commandId: string, data = new Uint8Array()): CommandOutcome => ({
  commandId,
  ok: true,
  exitCode: 0,
  durationMs: 5,
  timedOut: false,
  outputTruncated: false,
  error: "",
  errorReason: "",
  data,
  outputTail: new Uint8Array(),
  outputBytes: 0,
  unknownCommand: false,
});

function drain(host: AttachedHost): HostCommand[] {
  const seen: HostCommand[] = [];
  void (async () => {
    for await (const command of host.commands) seen.push(command);
  })();
  return seen;
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
const filled = (n: number) => new Uint8Array(n).fill(120);

describe("sandbox hub: unclaimed output and results", () => {
  let hub: SandboxHub;
  let warnings: string[];
  afterEach(() => hub?.close());

  const start = async (maxUnclaimedBytes: number, maxUnclaimedTotalBytes: number) => {
    warnings = [];
    const sink = new Writable({
      write(line: Buffer, _encoding, done) {
        const entry = JSON.parse(line.toString()) as { level: number; msg: string };
        if (entry.level === 40) warnings.push(entry.msg);
        done();
      },
    });
    hub = createSandboxHub(emptyStore(), { heartbeatIntervalMs: 10_000, reconnectGraceMs: 50, unclaimedTtlMs: 60_000, maxUnclaimedBytes, maxUnclaimedTotalBytes }, pino({ level: "warn" }, sink));
    const host = await hub.attach(registration);
    return { host, sent: drain(host) };
  };

  it("marks a re-attached command truncated when its unclaimed output went over the per-command bound", async () => {
    const { host } = await start(100, 10_000);
    host.receive({ kind: "output", commandId: "c1", stream: "stdout", chunk: filled(80) });
    host.receive({ kind: "output", commandId: "c1", stream: "stdout", chunk: filled(80) }); // over 100: dropped
    host.receive({ kind: "result", outcome: outcome("c1") });
    let received = 0;
    const result = await hub.reattach("host-a", WS, "c1", { onOutput: (_s, chunk) => (received += chunk.byteLength) }, AbortSignal.timeout(5000), 5000);
    expect(received).toBe(80);
    expect(result.outputTruncated).toBe(true);
  });

  it("bounds all unclaimed bytes, results included: the oldest command goes, logged, and its re-attach says truncated", async () => {
    const { host, sent } = await start(100, 250);
    host.receive({ kind: "output", commandId: "old", stream: "stdout", chunk: filled(100) });
    host.receive({ kind: "output", commandId: "mid", stream: "stdout", chunk: filled(100) });
    // A result's data counts too: 100 more bytes pushes the oldest command out.
    host.receive({ kind: "result", outcome: outcome("new", filled(100)) });
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/unclaimed command output dropped: over the 250 byte bound/);

    const kept = await hub.reattach("host-a", WS, "new", {}, AbortSignal.timeout(5000), 5000);
    expect(kept.data.byteLength).toBe(100);
    expect(kept.outputTruncated).toBe(false);

    // The dropped command is asked for again; when its result comes, it says output was lost.
    let received = 0;
    const again = hub.reattach("host-a", WS, "old", { onOutput: (_s, chunk) => (received += chunk.byteLength) }, AbortSignal.timeout(5000), 5000);
    await tick();
    expect(sent.map((c) => [c.commandId, c.action.kind])).toEqual([["old", "reattach"]]);
    host.receive({ kind: "result", outcome: outcome("old") });
    expect((await again).outputTruncated).toBe(true);
    expect(received).toBe(0);
  });
});
