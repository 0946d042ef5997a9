import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { createFleetRelay, type FleetRelay } from "./fleet-relay.js";
import { createRemoteSandboxDispatcher } from "./remote-sandbox-dispatcher.js";
import type { CommandOutcome, HostCommand, HostRegistration } from "./host-protocol.js";
import { createSandboxHub, HostUnavailableError, type AttachedHost, type SandboxHub } from "./sandbox-hub.js";
import type { RelayRecord, SandboxRelayStore, TakenRelay } from "./sandbox-relay-store.js";
import type { WorkspaceLeaseStore } from "./workspace-lease-store.js";

const WS = "11111111-1111-4111-8111-111111111111";
const SECRET = "s3cret-value-never-stored";

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

/** The ledger's relay table and NOTIFY in memory: wake-ups arrive after the write, as after a commit. */
function memoryRelays() {
  const listeners = new Set<(payload: string) => void>();
  const rows: (RelayRecord & { id: number })[] = [];
  const stored: RelayRecord[] = [];
  let next = 1;
  const emit = (payload: string) => setTimeout(() => listeners.forEach((l) => l(payload)), 1);
  const store: SandboxRelayStore = {
    async append(records) {
      for (const r of records) rows.push({ ...r, id: next++ });
      stored.push(...records);
      for (const to of new Set(records.map((r) => r.toReplica))) emit(to);
    },
    async take(replicaId, limit): Promise<TakenRelay[]> {
      const mine = rows.filter((r) => r.toReplica === replicaId).slice(0, limit);
      for (const r of mine) rows.splice(rows.indexOf(r), 1);
      return mine.map((r) => ({ commandId: r.commandId, kind: r.kind, body: JSON.parse(JSON.stringify(r.body)) as Record<string, unknown> }));
    },
    async withdraw(toReplica, commandId) {
      const at = rows.findIndex((r) => r.toReplica === toReplica && r.commandId === commandId && r.kind === "command");
      if (at < 0) return false;
      rows.splice(at, 1);
      return true;
    },
    prune: async () => 0,
  };
  const subscribe = (listener: (payload: string) => void) => {
    listeners.add(listener);
    return () => listeners.delete(listener);
  };
  return { store, subscribe, stored, rows };
}

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

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => new TextDecoder().decode(data);

/** Plays the host: answers each command it is sent with `answer`. */
function playHost(host: AttachedHost, answer: (command: HostCommand) => void): HostCommand[] {
  const seen: HostCommand[] = [];
  void (async () => {
    for await (const command of host.commands) {
      seen.push(command);
      answer(command);
    }
  })();
  return seen;
}

describe("fleet relay between two replicas", () => {
  const log = pino({ level: "silent" });
  let hubs: SandboxHub[] = [];
  let relays: FleetRelay[] = [];
  afterEach(() => {
    relays.forEach((r) => r.close());
    hubs.forEach((h) => h.close());
    hubs = [];
    relays = [];
  });

  /** Replica A has no host; replica B holds host-a (or, as far as `route` says, whoever it names). */
  /** What each replica's process environment holds: B has the secret variable, C does not. */
  const ENVIRONMENTS: Record<string, Record<string, string>> = { A: { KEEL_SECRET_TOKEN: SECRET }, B: { KEEL_SECRET_TOKEN: SECRET }, C: {} };
  const fleet = (route: (hostId: string) => string | undefined = (hostId) => (hostId === "host-a" ? "B" : undefined), holder = "B") => {
    const ledger = memoryRelays();
    const hub = () => createSandboxHub(emptyStore(), { heartbeatIntervalMs: 10_000, reconnectGraceMs: 50, unclaimedTtlMs: 60_000, maxUnclaimedBytes: 1024 }, log);
    hubs = [hub(), hub()];
    const [hubA, hubB] = hubs as [SandboxHub, SandboxHub];
    const relay = (replicaId: string, onHub: SandboxHub) =>
      createFleetRelay(onHub, ledger.store, { replicaId, route: async (hostId) => route(hostId), subscribe: ledger.subscribe, pollMs: 1_000, environment: ENVIRONMENTS[replicaId] ?? {} }, log);
    relays = [relay("A", hubA), relay(holder, hubB)];
    const [a, b] = relays as [FleetRelay, FleetRelay];
    return { ledger, hubA, hubB, a, b };
  };

  it("sends A's exec to B's host and brings its output back in order, then its outcome", async () => {
    const { a, hubB } = fleet();
    const host = await hubB.attach(registration);
    const seen = playHost(host, (command) => {
      host.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("one ") });
      host.receive({ kind: "output", commandId: command.commandId, stream: "stderr", chunk: bytes("two ") });
      host.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("three") });
      host.receive({ kind: "result", outcome: outcome(command.commandId, { exitCode: 3, outputTail: bytes("tail"), outputBytes: 13 }) });
    });
    const chunks: string[] = [];
    const exec: HostCommand = {
      commandId: "c1",
      action: { kind: "exec", workspaceId: WS, argv: ["sh", "-c", "x"], workingDirectory: "/workspace", env: { A: "1" }, timeoutMs: 1000, maxOutputBytes: 1024 },
      leaseEpoch: 7,
    };
    expect(await a.reachable("host-a")).toBe(true);
    const result = await a.send("host-a", exec, { onOutput: (stream, chunk) => chunks.push(`${stream}:${text(chunk)}`) }, AbortSignal.timeout(5_000), 1_000);
    expect(result).toMatchObject({ commandId: "c1", exitCode: 3, outputBytes: 13 });
    expect(text(result.outputTail)).toBe("tail");
    expect(chunks).toEqual(["stdout:one ", "stderr:two ", "stdout:three"]);
    // The host got the command as sent, lease epoch (its fence) included.
    expect(seen).toEqual([exec]);
  });

  it("carries a write's bytes and a read's data both ways", async () => {
    const { a, hubB } = fleet();
    const host = await hubB.attach(registration);
    const content = new Uint8Array([0, 1, 2, 255, 254]);
    const seen = playHost(host, (command) => host.receive({ kind: "result", outcome: outcome(command.commandId, { data: new Uint8Array([9, 8, 7]) }) }));
    const write: HostCommand = { commandId: "w1", action: { kind: "write_file", workspaceId: WS, path: "/workspace/f", content }, leaseEpoch: 2 };
    const done = await a.send("host-a", write, {}, AbortSignal.timeout(5_000), 1_000);
    expect([...done.data]).toEqual([9, 8, 7]);
    const sent = seen[0]?.action;
    expect(sent?.kind === "write_file" ? [...sent.content] : undefined).toEqual([...content]);
  });

  it("relays an acquire's secrets by name: the holder reads their values from its own environment", async () => {
    const { a, hubB, ledger } = fleet();
    const host = await hubB.attach(registration);
    const seen = playHost(host, (command) => host.receive({ kind: "result", outcome: outcome(command.commandId) }));
    const acquire: HostCommand = {
      commandId: "q1",
      action: { kind: "acquire", workspaceId: WS, runId: "r1", image: "img", networkAccess: false, env: { TOKEN: SECRET }, envSources: { TOKEN: "KEEL_SECRET_TOKEN" } },
    };
    await a.send("host-a", acquire, {}, AbortSignal.timeout(5_000), 1_000);
    // The host got the value; the table (and every wake-up, which carries only a replica id) never did.
    expect(seen).toEqual([acquire]);
    expect(JSON.stringify(ledger.stored)).toContain("KEEL_SECRET_TOKEN");
    expect(JSON.stringify(ledger.stored)).not.toContain(SECRET);
  });

  it("refuses to relay an acquire as not sent when the holder lacks a secret's variable, or a secret has no source", async () => {
    const { a, hubB, ledger } = fleet((hostId) => (hostId === "host-a" ? "C" : undefined), "C");
    const host = await hubB.attach(registration);
    const seen = playHost(host, (command) => host.receive({ kind: "result", outcome: outcome(command.commandId) }));
    const action = { kind: "acquire", workspaceId: WS, runId: "r1", image: "img", networkAccess: false, env: { TOKEN: SECRET } } as const;
    const missing = a.send("host-a", { commandId: "q2", action: { ...action, envSources: { TOKEN: "KEEL_SECRET_TOKEN" } } }, {}, AbortSignal.timeout(5_000), 1_000);
    await expect(missing).rejects.toBeInstanceOf(HostUnavailableError);
    await expect(missing).rejects.toThrow(/replica C, which holds the sandbox host, has no KEEL_SECRET_TOKEN in its environment/);
    const sourceless = a.send("host-a", { commandId: "q3", action }, {}, AbortSignal.timeout(5_000), 1_000);
    await expect(sourceless).rejects.toThrow(/secrets do not say where they came from/);
    expect(seen).toEqual([]);
    expect(JSON.stringify(ledger.stored)).not.toContain(SECRET);
  });

  it("fails as not sent when the holder no longer has the host, and leaves nothing in transit", async () => {
    const { a, ledger } = fleet();
    const exec: HostCommand = {
      commandId: "c2",
      action: { kind: "exec", workspaceId: WS, argv: ["true"], workingDirectory: "/workspace", env: {}, timeoutMs: 1000, maxOutputBytes: 1024 },
    };
    await expect(a.send("host-a", exec, {}, AbortSignal.timeout(5_000), 1_000)).rejects.toBeInstanceOf(HostUnavailableError);
    await expect(a.send("host-b", exec, {}, AbortSignal.timeout(5_000), 1_000)).rejects.toThrow(/not attached to any control-plane replica/);
    expect(ledger.rows).toEqual([]);
  });

  it("withdraws a command a dead holder never took and sends it where the host is now", async () => {
    // The ledger still names replica Z (killed, its row not stale yet) until Z's command is withdrawn.
    let holder = "Z";
    const { a, hubB, ledger } = fleet(() => holder);
    const host = await hubB.attach(registration);
    const seen = playHost(host, (command) => host.receive({ kind: "result", outcome: outcome(command.commandId, { exitCode: 4 }) }));
    const withdraw = ledger.store.withdraw.bind(ledger.store);
    ledger.store.withdraw = async (to, commandId) => {
      const withdrawn = await withdraw(to, commandId);
      if (withdrawn) holder = "B";
      return withdrawn;
    };
    const exec: HostCommand = {
      commandId: "c4",
      action: { kind: "exec", workspaceId: WS, argv: ["true"], workingDirectory: "/workspace", env: {}, timeoutMs: 10_000, maxOutputBytes: 1024 },
    };
    const result = await a.send("host-a", exec, {}, AbortSignal.timeout(20_000), 10_000);
    expect(result.exitCode).toBe(4);
    expect(seen.map((c) => c.commandId)).toEqual(["c4"]);
    expect(ledger.rows).toEqual([]);
  });

  it("says truncated when output could not be stored for the sender, never complete", async () => {
    const { a, hubB, ledger } = fleet();
    const host = await hubB.attach(registration);
    const append = ledger.store.append.bind(ledger.store);
    ledger.store.append = async (records) => {
      if (records.some((r) => r.kind === "output" && String(r.body["chunk"]) === Buffer.from("lost").toString("base64"))) throw new Error("disk full");
      return append(records);
    };
    // Output and result arrive together: the output's store is already under way (and fails) when
    // the result is queued, and the result's body is settled only when its own batch is formed.
    playHost(host, (command) => {
      host.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("lost") });
      host.receive({ kind: "result", outcome: outcome(command.commandId) });
    });
    const exec: HostCommand = {
      commandId: "c5",
      action: { kind: "exec", workspaceId: WS, argv: ["true"], workingDirectory: "/workspace", env: {}, timeoutMs: 1000, maxOutputBytes: 1024 },
    };
    const result = await a.send("host-a", exec, {}, AbortSignal.timeout(5_000), 1_000);
    expect(result.outputTruncated).toBe(true);
  });

  it("stops waiting when the caller gives up, as the hub does", async () => {
    const { a, hubB } = fleet();
    const host = await hubB.attach(registration);
    playHost(host, () => {}); // never answers
    const abort = new AbortController();
    const exec: HostCommand = {
      commandId: "c3",
      action: { kind: "exec", workspaceId: WS, argv: ["sleep", "9"], workingDirectory: "/workspace", env: {}, timeoutMs: 60_000, maxOutputBytes: 1024 },
    };
    const waiting = a.send("host-a", exec, {}, abort.signal, 60_000);
    setTimeout(() => abort.abort(new Error("gave up")), 20);
    await expect(waiting).rejects.toThrow("gave up");
  });

  it("collects an exec where its host went when the holding replica lost it mid-command", async () => {
    let holder = "B";
    const { a, b, hubA, hubB } = fleet((hostId) => (hostId === "host-a" ? holder : undefined));
    const onB = await hubB.attach(registration);
    const started = new Promise<void>((resolve) =>
      playHost(onB, (command) => {
        onB.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("before ") });
        resolve();
      }),
    );
    const exec: HostCommand = {
      commandId: "c6",
      action: { kind: "exec", workspaceId: WS, argv: ["sleep", "9"], workingDirectory: "/workspace", env: {}, timeoutMs: 60_000, maxOutputBytes: 1024 },
    };
    const chunks: string[] = [];
    const began = Date.now();
    const result = a.send("host-a", exec, { onOutput: (_stream, chunk) => chunks.push(text(chunk)) }, AbortSignal.timeout(30_000), 60_000);
    await started;
    await new Promise((resolve) => setTimeout(resolve, 200)); // B's output record reaches A
    // B goes away with the host's stream; the host, its exec still running, attaches to A.
    b.close();
    hubB.close();
    const onA = await hubA.attach(registration);
    holder = "A";
    const asked = playHost(onA, (command) => {
      onA.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("after") });
      onA.receive({ kind: "result", outcome: outcome(command.commandId, { exitCode: 0, outputBytes: 12 }) });
    });
    // The real outcome, from the exec that kept running: not unknown, and not after the 60 s timeout.
    await expect(result).resolves.toMatchObject({ commandId: "c6", exitCode: 0, outputBytes: 12 });
    expect(Date.now() - began).toBeLessThan(10_000);
    expect(chunks).toEqual(["before ", "after"]);
    // A asked the host for the command it already runs, never to run it again.
    expect(asked.map((c) => c.action.kind)).toEqual(["reattach"]);
  });

  it("gives a write whose holder lost the host an unknown outcome at once, never running it again", async () => {
    let holder = "B";
    const { a, b, hubA, hubB } = fleet((hostId) => (hostId === "host-a" ? holder : undefined));
    const onB = await hubB.attach(registration);
    const taken = new Promise<void>((resolve) => playHost(onB, () => resolve()));
    const write: HostCommand = { commandId: "w2", action: { kind: "write_file", workspaceId: WS, path: "/workspace/f", content: bytes("x") }, leaseEpoch: 1 };
    const began = Date.now();
    const result = a.send("host-a", write, {}, AbortSignal.timeout(30_000), 60_000);
    result.catch(() => undefined);
    await taken;
    b.close();
    hubB.close();
    const onA = await hubA.attach(registration);
    holder = "A";
    const asked = playHost(onA, () => {});
    await expect(result).rejects.toThrow(/lost it during command w2 \(write_file\): its outcome is unknown/);
    expect(Date.now() - began).toBeLessThan(10_000);
    expect(asked).toEqual([]);
  });

  it("sends a command its holder never took again, as itself, once the host is held elsewhere", async () => {
    let holder = "B";
    const { a, b, hubA, hubB, ledger } = fleet((hostId) => (hostId === "host-a" ? holder : undefined));
    // B is gone before it takes anything; the host comes to A.
    b.close();
    hubB.close();
    const onA = await hubA.attach(registration);
    const asked = playHost(onA, (command) => onA.receive({ kind: "result", outcome: outcome(command.commandId, { exitCode: 5 }) }));
    const exec: HostCommand = {
      commandId: "c7",
      action: { kind: "exec", workspaceId: WS, argv: ["true"], workingDirectory: "/workspace", env: {}, timeoutMs: 10_000, maxOutputBytes: 1024 },
    };
    const began = Date.now();
    const result = a.send("host-a", exec, {}, AbortSignal.timeout(20_000), 10_000);
    await new Promise((resolve) => setTimeout(resolve, 100));
    holder = "A";
    await expect(result).resolves.toMatchObject({ commandId: "c7", exitCode: 5 });
    // Withdrawn at the first poll that saw the move, not at the 3 s pickup deadline, and run as an exec, not asked after.
    expect(Date.now() - began).toBeLessThan(2_900);
    expect(asked).toEqual([exec]);
    expect(ledger.rows).toEqual([]);
  });
});

describe("re-attaching through the fleet after a restart", () => {
  const log = pino({ level: "silent" });

  it("waits for the host when the replica that held it dies between the check and the ask", async () => {
    // This replica (A) restarted. The ledger still names the dead replica Z as the host's holder
    // for one more look, then nobody; the host attaches here a moment later.
    const ledger = memoryRelays();
    const hub = createSandboxHub(emptyStore(), { heartbeatIntervalMs: 10_000, reconnectGraceMs: 50, unclaimedTtlMs: 60_000, maxUnclaimedBytes: 1024 }, log);
    let looks = 0;
    const relay = createFleetRelay(hub, ledger.store, { replicaId: "A", route: async () => (++looks === 1 ? "Z" : undefined), subscribe: ledger.subscribe, pollMs: 1_000, environment: {} }, log);
    const store = {
      ...emptyStore(),
      replicaId: "A",
      liveHosts: async () => [],
      placeWorkspace: async () => false,
      hostReplica: async () => undefined,
      activeWorkspaceOfRun: async (runId: string) => ({ id: WS, hostId: "host-a", runId, image: "keel-sandbox", status: "active" as const }),
    };
    const options = { placementWaitMs: 1_000, reattachWaitMs: 5_000, maxOutputBytes: 1024, maxExecTimeoutMs: 10_000, keepMs: 0 };
    const dispatcher = createRemoteSandboxDispatcher(hub, relay, store, options, log);
    try {
      const grant = { runId: "run-1", agentId: "agent-1", image: "keel-sandbox", labels: [], networkAccess: false, secrets: {}, secretSources: {} };
      const output: string[] = [];
      const reattached = dispatcher.reattach(grant, "c8", async (_stream, chunk) => void output.push(typeof chunk === "string" ? chunk : text(chunk)), AbortSignal.timeout(10_000));
      await new Promise((resolve) => setTimeout(resolve, 300));
      const host = await hub.attach(registration);
      const asked = playHost(host, (command) => {
        host.receive({ kind: "output", commandId: command.commandId, stream: "stdout", chunk: bytes("done\n") });
        host.receive({ kind: "result", outcome: outcome(command.commandId, { exitCode: 0, outputTail: bytes("done\n"), outputBytes: 5 }) });
      });
      await expect(reattached).resolves.toMatchObject({ exitCode: 0 });
      expect(asked).toEqual([{ commandId: "c8", action: { kind: "reattach", workspaceId: WS } }]);
      expect(output.join("")).toBe("done\n");
      expect(looks).toBeGreaterThanOrEqual(2);
    } finally {
      relay.close();
      hub.close();
    }
  });
});
