// The docker backend against a real engine: the WorkspaceBackend contract, then the
// hardening of every container, hostile workloads, the warm pool and the reaper.
// Skips (printing why) without a Docker engine, unless KEEL_REQUIRE_DOCKER=1 (CI).
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import Dockerode from "dockerode";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LABELS } from "../sandbox-agent/src/docker/container-config.js";
import { DEFAULT_MOUNT_BASE } from "../sandbox-agent/src/docker/workspace-disks.js";
import { createDockerWorkspaceBackend, type DockerWorkspaceBackend, type DockerWorkspaceBackendOptions } from "../sandbox-agent/src/docker/docker-workspace-backend.js";
import { describeWorkspaceBackendContract, runCommand } from "../sandbox-agent/src/workspace-backend.contract.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceLimits, type WorkspaceSpec } from "../sandbox-agent/src/workspace-backend.js";

const IMAGE = "keel/sandbox-base:busybox";

function whyDockerIsUnavailable(): string | undefined {
  const run = (args: string[]): string | undefined => {
    try {
      execFileSync("docker", args, { stdio: "pipe", timeout: 20_000 });
      return undefined;
    } catch (error) {
      const stderr = typeof error === "object" && error !== null && "stderr" in error ? String(error.stderr).trim() : "";
      return stderr !== "" ? stderr.split("\n").slice(-1)[0] : error instanceof Error ? error.message : String(error);
    }
  };
  const info = run(["info"]);
  if (info !== undefined) return `\`docker info\` failed (${info}); start the engine with scripts/start-dockerd.sh`;
  const image = run(["image", "inspect", IMAGE]);
  if (image !== undefined) return `image ${IMAGE} is missing; build it with scripts/build-sandbox-image.sh`;
  return undefined;
}

const unavailable = whyDockerIsUnavailable();
const required = process.env.KEEL_REQUIRE_DOCKER === "1";
if (unavailable !== undefined && !required) console.warn(`docker workspace backend tests skipped: ${unavailable}`);
if (unavailable !== undefined && required) {
  describe("docker workspace backend", () => {
    it("needs a Docker engine (KEEL_REQUIRE_DOCKER=1)", () => {
      throw new Error(unavailable);
    });
  });
}
const skip = unavailable !== undefined;

const docker = new Dockerode();
const hostIds: string[] = [];
const roots: string[] = [];

async function makeBackend(label: string, extra: Partial<DockerWorkspaceBackendOptions> = {}): Promise<{ backend: DockerWorkspaceBackend; root: string; hostId: string; logs: string[] }> {
  const root = await mkdtemp(path.join(tmpdir(), `keel-docker-ws-${label}-`));
  const hostId = `test-${label}-${randomUUID().slice(0, 8)}`;
  roots.push(root);
  hostIds.push(hostId);
  const logs: string[] = [];
  const backend = createDockerWorkspaceBackend({ docker, hostId, workspaceRoot: path.join(root, "workspaces"), log: (m) => logs.push(m), ...extra });
  return { backend, root: path.join(root, "workspaces"), hostId, logs };
}

async function containersOf(hostId: string): Promise<Dockerode.ContainerInfo[]> {
  return docker.listContainers({ all: true, filters: { label: [`${LABELS.hostId}=${hostId}`] } });
}

afterAll(async () => {
  if (skip) return;
  // Whatever a failed test left behind.
  for (const hostId of hostIds) {
    for (const c of await containersOf(hostId)) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
  }
  for (const root of roots) await rm(root, { recursive: true, force: true });
});

function spec(workspaceId: string, overrides: Partial<WorkspaceSpec> = {}): WorkspaceSpec {
  return { workspaceId, runId: `run-of-${workspaceId}`, image: IMAGE, networkAccess: false, env: {}, limits: DEFAULT_WORKSPACE_LIMITS, ...overrides };
}

const never = new AbortController().signal;

describeWorkspaceBackendContract(
  "docker (warm pool of 2)",
  async () => (await makeBackend("contract", { warmPool: [{ image: IMAGE, size: 2 }] })).backend,
  skip ? { skip: unavailable ?? "" } : { image: IMAGE },
);

describe.skipIf(skip)("docker workspace backend: hardening of every container", () => {
  const poolLimits: WorkspaceLimits = { memoryBytes: 256 * 1024 * 1024, nanoCpus: 500_000_000, pids: 128, tmpfsBytes: 16 * 1024 * 1024 };
  const coldLimits: WorkspaceLimits = { memoryBytes: 128 * 1024 * 1024, nanoCpus: 250_000_000, pids: 64, tmpfsBytes: 8 * 1024 * 1024 };
  let made: Awaited<ReturnType<typeof makeBackend>>;
  beforeAll(async () => {
    made = await makeBackend("hardening", { warmPool: [{ image: IMAGE, size: 1, limits: poolLimits }] });
    await made.backend.poolsFilled();
  });
  afterAll(async () => {
    await made.backend.reap(() => false);
    await made.backend.close();
  });

  it("sets user, capabilities, no-new-privileges, read-only root, tmpfs, limits, network, labels and the bind mount", async () => {
    const { backend, hostId } = made;
    await backend.acquire(spec("hard-warm", { limits: poolLimits }), never);
    const canary = `canary-${randomUUID()}`;
    await backend.acquire(spec("hard-cold", { limits: coldLimits, env: { KEEL_CANARY_SECRET: canary } }), never);
    await backend.acquire(spec("hard-net", { limits: coldLimits, networkAccess: true }), never);
    await backend.poolsFilled();

    const containers = await containersOf(hostId);
    // hard-warm's (from the pool), the pool's refill, hard-cold, hard-net.
    expect(containers).toHaveLength(4);
    const assigned = new Map((await backend.list()).map((w) => [w.workspaceId, w.runId]));
    expect([...assigned.keys()].sort()).toEqual(["hard-cold", "hard-net", "hard-warm"]);
    for (const summary of containers) {
      const info = await docker.getContainer(summary.Id).inspect();
      const labels = info.Config.Labels;
      const warm = labels[LABELS.warm] === "true";
      const workspaceLabel = labels[LABELS.workspaceId] ?? "";
      const limits = warm ? poolLimits : coldLimits;
      const what = `${info.Name} (${workspaceLabel})`;
      expect(info.Config.User, what).toBe("10001:10001");
      expect(info.HostConfig.CapDrop, what).toEqual(["ALL"]);
      expect(info.HostConfig.CapAdd ?? [], what).toEqual([]);
      expect(info.HostConfig.Privileged, what).toBe(false);
      expect(info.HostConfig.SecurityOpt, what).toContain("no-new-privileges");
      expect(info.HostConfig.ReadonlyRootfs, what).toBe(true);
      expect(info.HostConfig.Init, what).toBe(true);
      expect(info.HostConfig.Tmpfs?.["/tmp"], what).toBe(`rw,noexec,nosuid,nodev,size=${limits.tmpfsBytes}`);
      expect(info.HostConfig.PidsLimit, what).toBe(limits.pids);
      expect(info.HostConfig.Memory, what).toBe(limits.memoryBytes);
      expect(info.HostConfig.MemorySwap, what).toBe(limits.memoryBytes);
      expect(info.HostConfig.NanoCpus, what).toBe(limits.nanoCpus);
      expect(info.HostConfig.NetworkMode, what).toBe(workspaceLabel === "hard-net" ? "keel-workspaces" : "none");
      expect(labels[LABELS.hostId], what).toBe(hostId);
      expect(labels[LABELS.managed], what).toBe("true");
      expect(workspaceLabel, what).not.toBe("");
      expect(labels[LABELS.runId], what).toBe(warm ? "" : `run-of-${workspaceLabel}`);
      // Granted env goes to each exec, never into the container's configuration.
      expect(JSON.stringify(info), what).not.toContain(canary);
      const mounts = info.Mounts.filter((m) => m.Destination === "/workspace");
      expect(mounts, what).toHaveLength(1);
      expect(mounts[0]!.Type, what).toBe("bind");
      expect(mounts[0]!.RW, what).toBe(true);
      // The folder is the workspace's own quota'd file system, mounted outside the root (workspace-disks.ts).
      expect(path.dirname(path.dirname(mounts[0]!.Source)), what).toBe(DEFAULT_MOUNT_BASE);
      expect(execFileSync("findmnt", ["-n", "-o", "FSTYPE", mounts[0]!.Source], { encoding: "utf8" }).trim(), what).toBe("ext4");
      expect((await stat(mounts[0]!.Source)).uid, what).toBe(10001);
    }

    expect((await runCommand(backend, "hard-cold", ["sh", "-c", "echo $KEEL_CANARY_SECRET"])).stdout).toBe(`${canary}\n`);

    // And the settings hold at run time, inside a workspace.
    for (const id of ["hard-warm", "hard-cold"]) {
      const status = await runCommand(backend, id, ["sh", "-c", "id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; cat /sys/fs/cgroup/pids/pids.max"]);
      const expectedPids = id === "hard-warm" ? poolLimits.pids : coldLimits.pids;
      expect(status.stdout.split("\n").map((l) => l.replace(/\s+/g, " "))).toEqual([
        "10001",
        "10001",
        "CapPrm: 0000000000000000",
        "CapEff: 0000000000000000",
        "CapBnd: 0000000000000000",
        "NoNewPrivs: 1",
        String(expectedPids),
        "",
      ]);
    }
  });
});

describe.skipIf(skip)("docker workspace backend: hostile workloads are contained and recorded", () => {
  const limits: WorkspaceLimits = { memoryBytes: 64 * 1024 * 1024, nanoCpus: 1_000_000_000, pids: 64, tmpfsBytes: 8 * 1024 * 1024 };
  let made: Awaited<ReturnType<typeof makeBackend>>;
  const id = "hostile";
  beforeAll(async () => {
    made = await makeBackend("hostile");
    await made.backend.acquire(spec(id, { limits, env: { KEEL_CANARY_SECRET: "canary" } }), never);
  });
  afterAll(async () => {
    await made.backend.reap(() => false);
    await made.backend.close();
  });

  async function stillWorks(): Promise<void> {
    const outcome = await runCommand(made.backend, id, ["sh", "-c", "echo alive; ls /workspace"]);
    expect(outcome.result.exitCode).toBe(0);
    expect(outcome.stdout).toContain("alive");
  }

  it("a fork bomb hits the pids limit and ends by its timeout; nothing of it is left", async () => {
    // A subshell spawns sleeps until fork fails (busybox sh then exits); the shell itself spins
    // without forking, so only the timeout ends it, while every pid of the workspace is taken.
    const bomb = await runCommand(made.backend, id, ["sh", "-c", "( while :; do sleep 1000 & done ); while :; do :; done"], {
      timeoutMs: 2000,
      maxOutputBytes: 64 * 1024,
    });
    expect(bomb.result.timedOut).toBe(true);
    expect(bomb.stderr).toMatch(/can't fork|Resource temporarily unavailable/);
    expect(bomb.elapsedMs).toBeLessThan(8000);
    // (busybox timeout's watcher, which exits within a second, still shows the command line)
    const ps = await runCommand(made.backend, id, ["ps", "-o", "pid,args"]);
    expect(ps.stdout).not.toMatch(/^\s*\d+ sleep 1000/m);

    // The classic one: every process forks two more until fork fails everywhere.
    const classic = await runCommand(made.backend, id, ["sh", "-c", "f(){ f|f& };f"], { timeoutMs: 3000, maxOutputBytes: 64 * 1024 });
    expect(classic.elapsedMs).toBeLessThan(8000);
    await stillWorks();
  });

  it("a command that ends kills what it left running in its session, nothing else", async () => {
    // Busybox timeout's watcher of an earlier exec lingers for up to a second in a session of
    // its own; the sweep must leave such strangers alone and still find this command's children.
    await runCommand(made.backend, id, ["true"]);
    const left = await runCommand(made.backend, id, ["sh", "-c", "sleep 61 & sleep 62 >/dev/null 2>&1 & echo started"]);
    expect(left.result.exitCode).toBe(0);
    expect(left.stdout).toBe("started\n");
    expect(left.elapsedMs).toBeLessThan(3000);
    const ps = await runCommand(made.backend, id, ["ps", "-o", "pid,args"]);
    expect(ps.stdout).not.toMatch(/^\s*\d+ sleep 6[12]/m);
    // Another exec running meanwhile is another session: the sweep leaves it alone.
    const neighbour = runCommand(made.backend, id, ["sh", "-c", "sleep 2; echo done"], { timeoutMs: 10_000 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    await runCommand(made.backend, id, ["sh", "-c", "sleep 64 &"]);
    expect((await neighbour).stdout).toBe("done\n");
  });

  it("a memory hog is OOM-killed", async () => {
    const hog = await runCommand(made.backend, id, ["sh", "-c", 'x=$(head -c 900000000 /dev/zero | tr "\\000" a); echo survived'], { timeoutMs: 20_000 });
    expect(hog.result.exitCode).toBe(137);
    expect(hog.stdout).not.toContain("survived");
    await stillWorks();
  });

  it("100 MB of output is truncated at the cap with bounded memory", async () => {
    const cap = 1024 * 1024;
    let peak = process.memoryUsage().rss;
    const before = peak;
    const sampler = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().rss);
    }, 10);
    let forwarded = 0;
    let result;
    try {
      result = await made.backend.exec(
        id,
        { commandId: "big", argv: ["head", "-c", "104857600", "/dev/zero"], workingDirectory: "/workspace", env: {}, timeoutMs: 30_000, maxOutputBytes: cap },
        (_stream, chunk) => {
          forwarded += chunk.length;
        },
        never,
      );
    } finally {
      clearInterval(sampler);
    }
    expect(forwarded).toBe(cap);
    expect(result).toMatchObject({ exitCode: 0, timedOut: false, outputTruncated: true });
    // Holding the output would cost 100 MB.
    expect(peak - before).toBeLessThan(48 * 1024 * 1024);

    const endless = await runCommand(made.backend, id, ["yes"], { timeoutMs: 1500, maxOutputBytes: cap });
    expect(endless.forwardedBytes).toBe(cap);
    expect(endless.result).toMatchObject({ timedOut: true, outputTruncated: true });
    await stillWorks();
  });

  it("a sleep past its timeout is killed", async () => {
    const logged = made.logs.length;
    const sleeper = await runCommand(made.backend, id, ["sh", "-c", "sleep 60 & sleep 60; echo never"], { timeoutMs: 1000 });
    expect(sleeper.result.timedOut).toBe(true);
    expect(sleeper.elapsedMs).toBeLessThan(3000);
    expect(sleeper.stdout).toBe("");
    // Killed by the host's kill exec, not by a fallback.
    expect(made.logs.slice(logged)).toEqual([]);
    const ps = await runCommand(made.backend, id, ["ps", "-o", "pid,args"]);
    expect(ps.stdout).not.toMatch(/^\s*\d+ sleep 60/m);
  });

  it("writes outside /workspace fail; /tmp is small and not executable", async () => {
    for (const target of ["/etc/x", "/x", "/bin/x"]) {
      const outcome = await runCommand(made.backend, id, ["sh", "-c", `echo x > ${target}`]);
      expect(outcome.result.exitCode, target).not.toBe(0);
      expect(outcome.stderr, target).toMatch(/Read-only file system/);
    }
    const big = await runCommand(made.backend, id, ["sh", "-c", "head -c 20000000 /dev/zero > /tmp/big"]);
    expect(big.result.exitCode).not.toBe(0);
    const exec = await runCommand(made.backend, id, ["sh", "-c", "cp /bin/busybox /tmp/bb && /tmp/bb true"]);
    expect(exec.result.exitCode).not.toBe(0);
    await runCommand(made.backend, id, ["rm", "-f", "/tmp/big", "/tmp/bb"]);
  });

  it("has no network", async () => {
    // NetworkMode none: no interface but loopback, so the attempt fails locally (192.0.2.1 is a documentation address).
    const interfaces = await runCommand(made.backend, id, ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"]);
    expect(interfaces.stdout.trim()).toBe("lo");
    const wget = await runCommand(made.backend, id, ["wget", "-T", "2", "-q", "-O", "-", "http://192.0.2.1/"], { timeoutMs: 10_000 });
    expect(wget.result.exitCode).not.toBe(0);
    expect(wget.result.timedOut).toBe(false);
    await stillWorks();
  });
});

describe.skipIf(skip)("docker workspace backend: warm pool and reaper", () => {
  it("acquire takes a warm container and the pool refills to N in the background", async () => {
    const { backend, hostId } = await makeBackend("pool", { warmPool: [{ image: IMAGE, size: 2 }] });
    try {
      await backend.poolsFilled();
      expect(backend.poolStatus()).toEqual([{ image: IMAGE, size: 2, idle: 2 }]);
      const idleBefore = (await containersOf(hostId)).map((c) => c.Id);
      expect(idleBefore).toHaveLength(2);

      const started = performance.now();
      await backend.acquire(spec("pooled"), never);
      const warmMs = performance.now() - started;
      expect(warmMs).toBeLessThan(250);
      expect(backend.poolStatus()[0]!.idle).toBeLessThan(2);
      await backend.poolsFilled();
      expect(backend.poolStatus()).toEqual([{ image: IMAGE, size: 2, idle: 2 }]);
      const after = await containersOf(hostId);
      expect(after).toHaveLength(3);
      expect(after.filter((c) => c.Labels[LABELS.warm] === "true")).toHaveLength(3);
      expect(after.every((c) => c.State === "running")).toBe(true);
      expect(await backend.list()).toEqual([{ workspaceId: "pooled", runId: "run-of-pooled" }]);
      expect((await runCommand(backend, "pooled", ["sh", "-c", "pwd; id -u"])).stdout).toBe("/workspace\n10001\n");

      // A spec the pool cannot serve (network) is created cold and labelled with its own id.
      await backend.acquire(spec("cold-net", { networkAccess: true }), never);
      const cold = (await containersOf(hostId)).find((c) => c.Labels[LABELS.workspaceId] === "cold-net");
      expect(cold?.Labels[LABELS.warm]).toBeUndefined();
      expect(backend.poolStatus()[0]!.idle).toBe(2);
    } finally {
      await backend.reap(() => false);
      await backend.close();
    }
    expect(await containersOf(hostId)).toEqual([]);
  });

  it("after an agent restart, list() finds the workspaces and reap() removes rejected ones and orphaned pool containers", async () => {
    const first = await makeBackend("restart", { warmPool: [{ image: IMAGE, size: 1 }] });
    const other = await makeBackend("other-host");
    await first.backend.poolsFilled();
    await first.backend.acquire(spec("keep-me"), never);
    await first.backend.acquire(spec("drop-me"), never);
    await first.backend.acquire(spec("cold-one", { limits: { ...DEFAULT_WORKSPACE_LIMITS, pids: 100 } }), never);
    await first.backend.writeFile("keep-me", "note.txt", new TextEncoder().encode("kept"));
    await other.backend.acquire(spec("drop-me"), never);
    await first.backend.poolsFilled();
    // The first agent process dies here (no close): a new one starts on the same host.
    const second = createDockerWorkspaceBackend({ docker, hostId: first.hostId, workspaceRoot: first.root });
    try {
      const listed = await second.list();
      expect(listed.map((w) => w.workspaceId).sort()).toEqual(["cold-one", "drop-me", "keep-me"]);
      expect(listed).toContainEqual({ workspaceId: "keep-me", runId: "run-of-keep-me" });
      expect((await runCommand(second, "keep-me", ["cat", "note.txt"])).stdout).toBe("kept");

      const removed = await second.reap((workspaceId) => workspaceId === "keep-me");
      expect([...removed].sort()).toEqual(["cold-one", "drop-me"]);
      const left = await containersOf(first.hostId);
      // Only keep-me's container: the orphaned idle pool container went too.
      expect(left.map((c) => c.Id)).toHaveLength(1);
      expect((await second.list()).map((w) => w.workspaceId)).toEqual(["keep-me"]);
      // Another host's workspace of the same id is untouched.
      expect((await other.backend.list()).map((w) => w.workspaceId)).toEqual(["drop-me"]);
      expect((await runCommand(other.backend, "drop-me", ["true"])).result.exitCode).toBe(0);
    } finally {
      await second.reap(() => false);
      await second.close();
      await other.backend.reap(() => false);
      await other.backend.close();
    }
    expect(await containersOf(first.hostId)).toEqual([]);
  });
});
