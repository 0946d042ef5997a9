// Issue #17, item 2: install-wide settings live in the ledger. Two replicas on one database,
// started with different KEEL_MAX_CONCURRENT_ROOT_RUNS, apply the ledger's ceiling alike; a change
// through AgentService.PutInstallSettings (sent by @grpc/grpc-js, as a foreign admin tool would)
// takes effect on both without a restart; only admins may read or change the settings, and a
// value out of range is refused naming its field.
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import pg from "pg";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WaitReason } from "../gen/keel/v1/run_pb.js";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { DEMO_AGENT } from "../control-plane/src/fixtures/demo-agent.js";
import { createRunClaimRepository } from "../control-plane/src/ledger/run-claim.repository.js";
import { KEEL_BIN } from "./support/child-processes.js";
import { connectClient, grpcJsClient } from "./support/clients.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";

const AGENT = { ...DEMO_AGENT, id: "settings-agent", maxConcurrentRootRuns: 100 };

interface SettingsView {
  root_run_ceiling: number;
  retention_days: number;
  updated_by: string;
}

class Refusal extends Error {
  constructor(
    readonly code: grpc.status,
    message: string,
  ) {
    super(message);
  }
}

type Unary = (request: Record<string, unknown>, metadata: grpc.Metadata, done: (error: grpc.ServiceError | null, value: unknown) => void) => void;

/** AgentService's settings RPCs through @grpc/grpc-js, with the service loaded from the .proto files. */
async function grpcJsSettings(url: string) {
  const client = await grpcJsClient(url, "agent_service.proto", "AgentService");
  const call = (method: "GetInstallSettings" | "PutInstallSettings", request: Record<string, unknown>, token: string | undefined) =>
    new Promise<SettingsView>((resolve, reject) => {
      const metadata = new grpc.Metadata();
      if (token !== undefined) metadata.set("authorization", `Bearer ${token}`);
      const stub = (client as unknown as Record<string, Unary>)[method]!;
      stub.call(client, request, metadata, (error, value) => {
        // grpc-js leaves the grpc-message header percent-encoded.
        if (error !== null) return reject(new Refusal(error.code, decodeURIComponent(error.details)));
        resolve((value as { settings: SettingsView }).settings);
      });
    });
  return {
    get: (token: string | undefined) => call("GetInstallSettings", {}, token),
    put: (request: Record<string, unknown>, token: string | undefined) => call("PutInstallSettings", request, token),
    close: () => client.close(),
  };
}

/** Log lines written at `level` or above, parsed. */
function capturingLogger(level: "info" | "warn") {
  const lines: { msg: string; [key: string]: unknown }[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString("utf8").split("\n")) if (line.trim() !== "") lines.push(JSON.parse(line) as { msg: string });
      done();
    },
  });
  return { log: pino({ level }, stream), lines };
}

describe("install settings in the ledger, shared by two replicas", () => {
  let databaseUrl: string;
  let a: TestKeel;
  let b: TestKeel;
  let db: pg.Pool;
  let bLog: ReturnType<typeof capturingLogger>;
  let aLog: ReturnType<typeof capturingLogger>;
  let settingsA: Awaited<ReturnType<typeof grpcJsSettings>>;
  let settingsB: Awaited<ReturnType<typeof grpcJsSettings>>;

  beforeAll(async () => {
    databaseUrl = await createTestDatabase();
    aLog = capturingLogger("info");
    bLog = capturingLogger("warn");
    // One after the other: the first start on a ledger nobody has set adopts its variable once.
    a = await startTestKeel({ databaseUrl, workers: 0, agents: [AGENT], env: { KEEL_MAX_CONCURRENT_ROOT_RUNS: "2" }, log: aLog.log });
    b = await startTestKeel({ databaseUrl, workers: 0, agents: [], env: { KEEL_MAX_CONCURRENT_ROOT_RUNS: "5" }, log: bLog.log });
    db = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    settingsA = await grpcJsSettings(a.url);
    settingsB = await grpcJsSettings(b.url);
  }, 120_000);

  afterAll(async () => {
    settingsA?.close();
    settingsB?.close();
    await db?.end();
    await b?.stop();
    await a?.stop();
  });

  /** A root run of AGENT in a conversation of its own: executing under a live lease, queued, or finished long ago. */
  async function insertRun(kind: "executing" | "queued" | "finished", createdAt: Date): Promise<string> {
    await db.query("INSERT INTO actors (id) VALUES ('someone') ON CONFLICT DO NOTHING");
    const conversationId = randomUUID();
    await db.query("INSERT INTO conversations (id, agent_id, external_id, connector) VALUES ($1, $2, $3, 'test')", [conversationId, AGENT.id, conversationId]);
    const id = randomUUID();
    const status = kind === "executing" ? "running" : kind === "queued" ? "queued" : "succeeded";
    await db.query(
      `INSERT INTO runs (id, agent_id, conversation_id, connector, status, requested_by_actor_id, budget, usage, request_received_at, created_at,
         started_at, lease_owner, lease_expires_at, finished_at)
       VALUES ($1, $2, $3, 'test', $4::text, 'someone', '{}', '{}', $5::timestamptz, $5::timestamptz,
         CASE WHEN $4::text <> 'queued' THEN $5::timestamptz END, CASE WHEN $4::text = 'running' THEN 'elsewhere' END,
         CASE WHEN $4::text = 'running' THEN now() + interval '1 hour' END, CASE WHEN $4::text = 'succeeded' THEN now() - interval '2 days' END)`,
      [id, AGENT.id, conversationId, status, createdAt],
    );
    return id;
  }

  const waitReasonOn = async (keel: TestKeel, runId: string): Promise<WaitReason> => {
    const { run } = await connectClient(RunService, keel.url, keel.tokens.operator).getRun({ runId });
    return run?.waitReason ?? WaitReason.UNSPECIFIED;
  };

  it("adopts the first replica's deprecated variable once; the other replica is warned its own is ignored", async () => {
    for (const [settings, token] of [[settingsA, a.tokens.admin], [settingsB, b.tokens.admin]] as const) {
      const seen = await settings.get(token);
      expect(seen.root_run_ceiling).toBe(2);
      expect(seen.retention_days).toBe(30);
      expect(seen.updated_by).toBe("environment (KEEL_MAX_CONCURRENT_ROOT_RUNS)");
    }
    const adopted = aLog.lines.filter((line) => line.msg.includes("KEEL_MAX_CONCURRENT_ROOT_RUNS"));
    expect(adopted).toHaveLength(1);
    expect(adopted[0]?.msg).toMatch(/deprecated: copied once into the ledger/);
    const warned = bLog.lines.filter((line) => line.msg.includes("KEEL_MAX_CONCURRENT_ROOT_RUNS"));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({ level: 40, variable: "KEEL_MAX_CONCURRENT_ROOT_RUNS", environment: 5, ledger: 2 });
    expect(warned[0]?.msg).toMatch(/ignored: the ledger's root_run_ceiling \(2\) applies on every replica; change it with `keel settings set --root-run-ceiling N`/);
  });

  it("applies the ledger's ceiling on both replicas, and a change made through one replica on both at once", async () => {
    const base = Date.now() - 60_000;
    await insertRun("executing", new Date(base));
    await insertRun("executing", new Date(base + 1));
    const first = await insertRun("queued", new Date(base + 2));
    const second = await insertRun("queued", new Date(base + 3));
    const claimsOnA = createRunClaimRepository(a.app.ledger.sql);
    const claimsOnB = createRunClaimRepository(b.app.ledger.sql);

    // Ceiling 2 (replica A's variable; B's says 5): two root runs execute, so nothing may start on either.
    expect(await waitReasonOn(a, first)).toBe(WaitReason.CONCURRENCY_CEILING);
    expect(await waitReasonOn(b, first)).toBe(WaitReason.CONCURRENCY_CEILING);
    expect(await claimsOnB.claimNext("b-worker", 60_000)).toBeUndefined();
    expect(await claimsOnA.claimNext("a-worker", 60_000)).toBeUndefined();

    // Raised to 3 through replica A: replica B's next claim starts the older queued run.
    const changed = await settingsA.put({ root_run_ceiling: 3 }, a.tokens.admin);
    expect(changed.root_run_ceiling).toBe(3);
    expect(changed.retention_days).toBe(30);
    expect(changed.updated_by).toMatch(/^admin token \S+/);
    // Recorded where it was made: who, and each old and new value.
    expect(aLog.lines.filter((line) => line.msg === "install settings changed")).toEqual([
      expect.objectContaining({ level: 30, by: changed.updated_by, changed: { root_run_ceiling: "2 -> 3" } }),
    ]);
    expect((await settingsB.get(b.tokens.admin)).root_run_ceiling).toBe(3);
    expect(await waitReasonOn(b, first)).toBe(WaitReason.UNSPECIFIED);
    expect((await claimsOnB.claimNext("b-worker", 60_000))?.runId).toBe(first);

    // Three execute now: the next one waits on both replicas again.
    expect(await claimsOnA.claimNext("a-worker", 60_000)).toBeUndefined();
    expect(await waitReasonOn(a, second)).toBe(WaitReason.CONCURRENCY_CEILING);
    expect(await waitReasonOn(b, second)).toBe(WaitReason.CONCURRENCY_CEILING);
  });

  it("sweeps by the ledger's retention_days on every replica", async () => {
    const old = await insertRun("finished", new Date(Date.now() - 3 * 86_400_000));
    const exists = async () => (await db.query("SELECT 1 FROM runs WHERE id = $1", [old])).rowCount === 1;
    // 30 days (the default): a run finished two days ago stays.
    await b.app.retention.sweepNow();
    expect(await exists()).toBe(true);
    // One day, set through replica B, and swept by replica A without a restart.
    expect((await settingsB.put({ retention_days: 1 }, b.tokens.admin)).retention_days).toBe(1);
    await a.app.retention.sweepNow();
    expect(await exists()).toBe(false);
    // Only the field given changed.
    expect((await settingsA.get(a.tokens.admin)).root_run_ceiling).toBe(3);
  });

  it("lets only admins read or change the settings", async () => {
    for (const role of ["operator", "connector", "sandbox-host"] as const) {
      await expect(settingsA.get(a.tokens[role])).rejects.toMatchObject({ code: grpc.status.PERMISSION_DENIED });
      await expect(settingsA.put({ root_run_ceiling: 50 }, a.tokens[role])).rejects.toMatchObject({ code: grpc.status.PERMISSION_DENIED });
    }
    await expect(settingsB.get(undefined)).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED });
    await expect(settingsB.put({ root_run_ceiling: 50 }, undefined)).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED });
    await expect(settingsB.put({ root_run_ceiling: 50 }, "keel_not-a-real-token")).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED });
    expect((await settingsB.get(b.tokens.admin)).root_run_ceiling).toBe(3);
  });

  it("refuses values out of range with InvalidArgument naming the field, and changes nothing", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ root_run_ceiling: 0 }, "root_run_ceiling"],
      [{ root_run_ceiling: 100_001 }, "root_run_ceiling"],
      [{ root_run_ceiling: 4_294_967_295 }, "root_run_ceiling"],
      [{ retention_days: 36_501 }, "retention_days"],
      [{ root_run_ceiling: 10, retention_days: 40_000 }, "retention_days"],
    ];
    for (const [request, field] of cases) {
      const refused = await settingsA.put(request, a.tokens.admin).then(
        () => undefined,
        (error: unknown) => error as Refusal,
      );
      expect(refused?.code, JSON.stringify(request)).toBe(grpc.status.INVALID_ARGUMENT);
      expect(refused?.message).toMatch(new RegExp(`^${field}: `));
    }
    const after = await settingsA.get(a.tokens.admin);
    expect([after.root_run_ceiling, after.retention_days]).toEqual([3, 1]);
  });

  it("keel settings get and set change them from the command line", async () => {
    const run = promisify(execFile);
    const env = { ...process.env, KEEL_URL: b.url, KEEL_TOKEN: b.tokens.admin, KEEL_LOG_LEVEL: "silent" };
    const set = await run(process.execPath, [KEEL_BIN, "settings", "set", "--root-run-ceiling", "7"], { env, timeout: 60_000 });
    expect(set.stdout).toMatch(/^root_run_ceiling 7\nretention_days 1\nchanged by admin token \S+ .*at \d{4}-/);
    const got = await run(process.execPath, [KEEL_BIN, "settings", "get"], { env, timeout: 60_000 });
    expect(got.stdout.split("\n").slice(0, 2)).toEqual(["root_run_ceiling 7", "retention_days 1"]);
    const bad = await run(process.execPath, [KEEL_BIN, "settings", "set", "--root-run-ceiling", "many"], { env, timeout: 60_000 }).then(
      () => undefined,
      (error: unknown) => error as { code: number; stderr: string },
    );
    expect(bad?.code).toBe(2);
    expect(bad?.stderr).toMatch(/--root-run-ceiling many is not a whole number/);
  }, 120_000);
});
