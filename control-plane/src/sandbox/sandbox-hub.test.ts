import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import type { CommandOutcome, HostCommand, HostRegistration } from "./host-protocol.js";
import { createObservationPump } from "./observation-pump.js";
import { createSandboxHub, HostLostError, type AttachedHost, type SandboxHub } from "./sandbox-hub.js";
import type { WorkspaceLease, WorkspaceLeaseStore } from "./workspace-lease-store.js";

const WS = "11111111-1111-4111-8111-111111111111";

/** The ledger side in memory: hosts by id, workspaces by id. */
function memoryStore(): WorkspaceLeaseStore & { workspaces: Map<string, WorkspaceLease>; instances: Map<string, string>; elsewhere: Map<string, string> } {
  const workspaces = new Map<string, WorkspaceLease>();
  const instances = new Map<string, string>();
  /** Hosts another replica holds a live stream of, and the agent instance holding it. */
  const elsewhere = new Map<string, string>();
  const connected = new Set<string>();
  return {
    workspaces,
    instances,
    elsewhere,
    async instanceAttachedElsewhere(hostId) {
      return elsewhere.get(hostId);
    },
    async registerHost(host) {
      const previous = instances.get(host.hostId);
      instances.set(host.hostId, host.instanceId);
      connected.add(host.hostId);
      return previous;
    },
    async hostDisconnected(hostId) {
      connected.delete(hostId);
    },
    async heartbeat() {},
    async isHostConnected(hostId) {
      return connected.has(hostId);
    },
    async activeWorkspaceIdsOfHost(hostId) {
      return [...workspaces.values()].filter((w) => w.hostId === hostId && w.status === "active").map((w) => w.id);
    },
    async markLost(hostId, ids) {
      const marked: string[] = [];
      for (const w of workspaces.values()) {
        if (w.hostId === hostId && w.status === "active" && (ids === "all" || ids.includes(w.id))) {
          workspaces.set(w.id, { ...w, status: "lost" });
          marked.push(w.id);
        }
      }
      return marked;
    },
    async markLostIfDetached(hostId) {
      return this.markLost(hostId, "all");
    },
    async activeWorkspaceOfRun(runId) {
      return [...workspaces.values()].find((w) => w.runId === runId && w.status === "active");
    },
    async activeCountsByHost() {
      return new Map();
    },
    async createWorkspace(lease) {
      workspaces.set(lease.id, { ...lease, status: "active" });
    },
    async finish(id, status) {
      const w = workspaces.get(id);
      if (w?.status !== "active") return false;
      workspaces.set(id, { ...w, status });
      return true;
    },
    async dueForRelease() {
      return [];
    },
  };
}

const registration = (instanceId: string, running: HostRegistration["running"] = []): HostRegistration => ({
  hostId: "host-a",
  instanceId,
  capacity: { workspaces: 2, cpuMillis: 1000, memoryBytes: 1 },
  labels: {},
  backends: ["docker"],
  images: [],
  running,
  agentVersion: "test",
});

const outcome = (commandId: string, extra: Partial<CommandOutcome> = {}): CommandOutcome => ({
  commandId,
  ok: true,
  exitCode: 0,
  durationMs: 5,
  timedOut: false,
  outputTruncated: false,
  error: "",
  errorReason: "",
  data: new Uint8Array(),
  outputTail: new Uint8Array(),
  outputBytes: 0,
  unknownCommand: false,
  ...extra,
});

/** Collects the commands the hub sends down a host's stream. */
function drain(host: AttachedHost): HostCommand[] {
  const seen: HostCommand[] = [];
  void (async () => {
    for await (const command of host.commands) seen.push(command);
  })();
  return seen;
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
const bytes = (text: string) => new TextEncoder().encode(text);
const execOf = (commandId: string): HostCommand => ({
  commandId,
  action: { kind: "exec", workspaceId: WS, argv: ["true"], workingDirectory: "/workspace", env: {}, timeoutMs: 1000, maxOutputBytes: 1024 },
});

describe("sandbox hub", () => {
  let hub: SandboxHub;
  afterEach(() => hub?.close());

  const start = (store = memoryStore(), reconnectGraceMs = 50) => {
    hub = createSandboxHub(store, { heartbeatIntervalMs: 10_000, reconnectGraceMs, unclaimedTtlMs: 60_000, maxUnclaimedBytes: 1024 }, pino({ level: "silent" }));
    return store;
  };

  it("refuses another agent instance while another replica holds the host, and lets the same instance move here", async () => {
    const store = start();
    store.elsewhere.set("host-a", "i-other");
    await expect(hub.attach(registration("i1"))).rejects.toThrow(/attached to another control-plane replica by another live agent instance/);
    expect(hub.isAttached("host-a")).toBe(false);
    store.elsewhere.set("host-a", "i1");
    await hub.attach(registration("i1"));
    expect(hub.isAttached("host-a")).toBe(true);
  });

  it("sends a command and routes its output, in order, then its result", async () => {
    start();
    const host = await hub.attach(registration("i1"));
    const sent = drain(host);
    const chunks: string[] = [];
    const done = hub.send("host-a", execOf("c1"), { onOutput: (stream, chunk) => chunks.push(`${stream}:${new TextDecoder().decode(chunk)}`) }, AbortSignal.timeout(5000), 5000);
    await tick();
    expect(sent.map((c) => c.commandId)).toEqual(["c1"]);
    host.receive({ kind: "output", commandId: "c1", stream: "stdout", chunk: bytes("a") });
    host.receive({ kind: "output", commandId: "c1", stream: "stderr", chunk: bytes("b") });
    host.receive({ kind: "result", outcome: outcome("c1", { exitCode: 3 }) });
    expect((await done).exitCode).toBe(3);
    expect(chunks).toEqual(["stdout:a", "stderr:b"]);
  });

  it("declares a command's outcome unknown once its host stays away past the grace, and its workspaces lost", async () => {
    const store = start();
    await store.createWorkspace({ id: WS, hostId: "host-a", runId: "r", image: "i" });
    const host = await hub.attach(registration("i1", [{ workspaceId: WS, runId: "r", runningCommandIds: [] }]));
    drain(host);
    const done = hub.send("host-a", execOf("c1"), {}, AbortSignal.timeout(5000), 5000);
    host.close("stream broke");
    await expect(done).rejects.toBeInstanceOf(HostLostError);
    await tick();
    expect(store.workspaces.get(WS)?.status).toBe("lost");
  });

  it("picks a command up again when the same agent process re-attaches within the grace", async () => {
    const store = start(memoryStore(), 500);
    await store.createWorkspace({ id: WS, hostId: "host-a", runId: "r", image: "i" });
    const first = await hub.attach(registration("i1", [{ workspaceId: WS, runId: "r", runningCommandIds: [] }]));
    drain(first);
    const done = hub.send("host-a", execOf("c1"), {}, AbortSignal.timeout(5000), 5000);
    first.close("network blip");
    const second = await hub.attach(registration("i1", [{ workspaceId: WS, runId: "r", runningCommandIds: ["c1"] }]));
    expect(second.registered.reapWorkspaceIds).toEqual([]);
    const sent = drain(second);
    await tick();
    // The hub asks again by id; the host answers with the result it kept.
    expect(sent).toEqual([{ commandId: "c1", action: { kind: "reattach", workspaceId: WS } }]);
    second.receive({ kind: "result", outcome: outcome("c1") });
    expect((await done).ok).toBe(true);
    expect(store.workspaces.get(WS)?.status).toBe("active");
  });

  it("has the host reap workspaces this control plane does not consider active", async () => {
    const store = start();
    await store.createWorkspace({ id: WS, hostId: "host-a", runId: "r", image: "i" });
    const gone = "22222222-2222-4222-8222-222222222222";
    await store.createWorkspace({ id: gone, hostId: "host-a", runId: "r2", image: "i" });
    const host = await hub.attach(
      registration("i1", [
        { workspaceId: WS, runId: "r", runningCommandIds: [] },
        { workspaceId: "left-over-from-a-test", runId: "", runningCommandIds: [] },
      ]),
    );
    expect(host.registered.reapWorkspaceIds).toEqual(["left-over-from-a-test"]);
    // The host no longer has `gone`: it is lost, not silently kept.
    expect(store.workspaces.get(gone)?.status).toBe("lost");
    expect(store.workspaces.get(WS)?.status).toBe("active");
  });

  it("treats a re-registration by another agent process as a restart: commands unknown, workspaces lost and reaped", async () => {
    const store = start(memoryStore(), 10_000);
    await store.createWorkspace({ id: WS, hostId: "host-a", runId: "r", image: "i" });
    const first = await hub.attach(registration("i1", [{ workspaceId: WS, runId: "r", runningCommandIds: [] }]));
    drain(first);
    const done = hub.send("host-a", execOf("c1"), {}, AbortSignal.timeout(5000), 5000);
    first.close("killed");
    const second = await hub.attach(registration("i2", [{ workspaceId: WS, runId: "r", runningCommandIds: [] }]));
    await expect(done).rejects.toThrow(/restarted/);
    expect(second.registered.reapWorkspaceIds).toEqual([WS]);
    expect(store.workspaces.get(WS)?.status).toBe("lost");
  });

  it("keeps output and a result nobody waited for, and hands them to a later re-attach", async () => {
    start();
    const host = await hub.attach(registration("i1"));
    const sent = drain(host);
    host.receive({ kind: "output", commandId: "c9", stream: "stdout", chunk: bytes("while you were away") });
    host.receive({ kind: "result", outcome: outcome("c9") });
    const chunks: string[] = [];
    const result = await hub.reattach("host-a", WS, "c9", { onOutput: (_s, chunk) => chunks.push(new TextDecoder().decode(chunk)) }, AbortSignal.timeout(5000), 5000);
    expect(result.ok).toBe(true);
    expect(chunks).toEqual(["while you were away"]);
    await tick();
    expect(sent).toEqual([]); // nothing needed asking
  });

  it("lets a caller give up without cancelling the command on its host", async () => {
    start();
    const host = await hub.attach(registration("i1"));
    drain(host);
    const abort = new AbortController();
    const done = hub.send("host-a", execOf("c1"), {}, abort.signal, 5000);
    abort.abort(new Error("worker stopping"));
    await expect(done).rejects.toThrow("worker stopping");
    // The result still arrives later and is kept for whoever re-attaches.
    host.receive({ kind: "result", outcome: outcome("c1", { exitCode: 7 }) });
    expect((await hub.reattach("host-a", WS, "c1", {}, AbortSignal.timeout(5000), 5000)).exitCode).toBe(7);
  });

  it("holds a host's stream while the output's consumer is behind, without taking the silence for a dead host", async () => {
    hub = createSandboxHub(memoryStore(), { heartbeatIntervalMs: 20, reconnectGraceMs: 50, unclaimedTtlMs: 60_000, maxUnclaimedBytes: 1024 }, pino({ level: "silent" }));
    const host = await hub.attach(registration("i1"));
    drain(host);
    let catchUp: () => void = () => {};
    const behind = new Promise<void>((resolve) => (catchUp = resolve));
    let chunks = 0;
    const done = hub.send("host-a", execOf("c1"), { onOutput: () => void (chunks += 1), backlog: () => (chunks >= 2 ? behind : undefined) }, AbortSignal.timeout(5000), 5000);
    await tick();
    host.receive({ kind: "output", commandId: "c1", stream: "stdout", chunk: bytes("a") });
    expect(host.holdOff()).toBeUndefined();
    host.receive({ kind: "output", commandId: "c1", stream: "stdout", chunk: bytes("b") });
    const held = host.holdOff();
    expect(held).toBeDefined();
    // Many heartbeat intervals without a message: the host stays attached while it is held.
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(hub.isAttached("host-a")).toBe(true);
    catchUp();
    await held;
    host.receive({ kind: "result", outcome: outcome("c1") });
    expect((await done).ok).toBe(true);
  });
});

describe("observation pump", () => {
  it("persists redacted text, merges what queued up, and drops output past the cap", async () => {
    const written: [string, string][] = [];
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => (release = resolve));
    const pump = createObservationPump({
      secrets: [{ name: "TOKEN", value: "hunter2" }],
      maxBytes: 22,
      sink: async (stream, text) => {
        await gate;
        written.push([stream, typeof text === "string" ? text : new TextDecoder().decode(text)]);
      },
    });
    pump.push("stdout", bytes("pass=hun"));
    pump.push("stdout", bytes("ter2 ok\n"));
    pump.push("stderr", bytes("warn\0\n"));
    pump.push("stdout", bytes("0123456789"));
    release();
    await pump.finish();
    const stdout = written.filter(([s]) => s === "stdout").map(([, t]) => t).join("");
    expect(stdout).toBe("pass=[redacted:TOKEN] ok\n");
    expect(written.filter(([s]) => s === "stderr")).toEqual([["stderr", "warn\u2400\n"]]);
    expect(pump.bytes).toBe(22);
    expect(pump.truncated).toBe(true);
  });
});
