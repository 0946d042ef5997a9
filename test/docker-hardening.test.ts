// Issue #12 item 7: what a hostile command in a Docker workspace cannot do: fill the host's
// disk past its quota, open unbounded files or processes, reach other workspaces, the host's
// ports or the cloud metadata address through a granted network; and what `docker inspect`
// shows of it. Real engine; skips (printing why) without Docker unless KEEL_REQUIRE_DOCKER=1.
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, rm, statfs } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import Dockerode from "dockerode";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LABELS, NOFILE_LIMIT, NPROC_LIMIT } from "../sandbox-agent/src/docker/container-config.js";
import { createDockerWorkspaceBackend, type DockerWorkspaceBackend } from "../sandbox-agent/src/docker/docker-workspace-backend.js";
import { BLOCKED_RANGES, WORKSPACE_BRIDGE, WORKSPACE_NETWORK } from "../sandbox-agent/src/docker/workspace-network.js";
import { runCommand } from "../sandbox-agent/src/workspace-backend.contract.js";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceSpec } from "../sandbox-agent/src/workspace-backend.js";
import { SANDBOX_IMAGE as IMAGE, skipWithoutDocker } from "./support/sandbox-support.js";

const skip = skipWithoutDocker("docker hardening");
const docker = new Dockerode();
const never = new AbortController().signal;
const QUOTA = 64 * 1024 * 1024;

let backend: DockerWorkspaceBackend;
let root: string;
let hostId: string;
const logs: string[] = [];

function spec(workspaceId: string, overrides: Partial<WorkspaceSpec> = {}): WorkspaceSpec {
  return { workspaceId, runId: `run-of-${workspaceId}`, image: IMAGE, networkAccess: false, env: {}, limits: DEFAULT_WORKSPACE_LIMITS, ...overrides };
}

async function containerOf(workspaceId: string): Promise<Dockerode.ContainerInspectInfo> {
  const [found] = await docker.listContainers({ all: true, filters: { label: [`${LABELS.hostId}=${hostId}`, `${LABELS.workspaceId}=${workspaceId}`] } });
  if (found === undefined) throw new Error(`no container for ${workspaceId}`);
  return docker.getContainer(found.Id).inspect();
}

beforeAll(async () => {
  if (skip) return;
  root = await mkdtemp(path.join(tmpdir(), "keel-docker-hardening-"));
  hostId = `test-hardening-${randomUUID().slice(0, 8)}`;
  backend = createDockerWorkspaceBackend({ docker, hostId, workspaceRoot: path.join(root, "workspaces"), diskQuotaBytes: QUOTA, log: (m) => logs.push(m) });
});

afterAll(async () => {
  if (skip) return;
  await backend.reap(() => false);
  await backend.close();
  await rm(root, { recursive: true, force: true });
});

describe.skipIf(skip)("docker hardening: disk quota", () => {
  it("a 200 GB dd stops at the workspace quota with ENOSPC; the host's free space is unaffected; host-side reads work", async () => {
    await backend.acquire(spec("disk"), never);
    const before = await statfs(root);
    const dd = await runCommand(backend, "disk", ["sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=204800; echo rc=$?; df -k /workspace | tail -n 1"], {
      timeoutMs: 60_000,
    });
    const after = await statfs(root);
    expect(dd.result.timedOut).toBe(false);
    expect(dd.elapsedMs).toBeLessThan(30_000);
    expect(dd.stderr).toMatch(/No space left on device/);
    expect(dd.stdout).toMatch(/rc=1/);
    // The file system inside is the quota's size (df in KiB), not the host's disk.
    const size = Number(/^\S+\s+(\d+)/m.exec(dd.stdout)?.[1]);
    expect(size * 1024).toBeLessThanOrEqual(QUOTA);
    expect(size * 1024).toBeGreaterThan(QUOTA / 2);
    // What the host lost is at most the quota (plus noise from other tenants of this disk).
    const lostBytes = (before.bavail - after.bavail) * before.bsize;
    expect(lostBytes).toBeLessThan(QUOTA + 256 * 1024 * 1024);

    // The agent's host-side reads and writes of the workspace keep working at the quota.
    const listed = await backend.listFiles("disk", ".");
    expect(listed.map((f) => f.path)).toContain("/workspace/big");
    expect(listed.find((f) => f.path === "/workspace/big")!.sizeBytes).toBeGreaterThan(QUOTA / 2);
    await runCommand(backend, "disk", ["rm", "/workspace/big"]);
    await backend.writeFile("disk", "note.txt", new TextEncoder().encode("after the flood"));
    expect(new TextDecoder().decode(await backend.readFile("disk", "note.txt", 1024))).toBe("after the flood");
    expect((await runCommand(backend, "disk", ["cat", "/workspace/note.txt"])).stdout).toBe("after the flood");

    // release() unmounts and removes the image with the folder.
    await backend.release("disk");
    expect(execFileSync("mount", { encoding: "utf8" })).not.toContain(root);
  });
});

describe.skipIf(skip)("docker hardening: quota mounts and a deleted data dir", () => {
  it("rm -rf of a data dir with unreleased workspaces succeeds, and the next agent start unmounts what it orphaned", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "keel-docker-orphan-"));
    const orphanHost = `test-orphan-${randomUUID().slice(0, 8)}`;
    const first = createDockerWorkspaceBackend({ docker, hostId: orphanHost, workspaceRoot: path.join(dataDir, "workspaces"), diskQuotaBytes: QUOTA });
    await first.acquire(spec("orphan"), never);
    const [container] = await docker.listContainers({ all: true, filters: { label: [`${LABELS.hostId}=${orphanHost}`] } });
    const mountPoint = (await docker.getContainer(container!.Id).inspect()).Mounts.find((m) => m.Destination === "/workspace")!.Source;
    const mounted = (): boolean => execFileSync("findmnt", ["-l", "-n", "-o", "TARGET"], { encoding: "utf8" }).split("\n").includes(mountPoint);
    expect(mounted()).toBe(true);
    // What a test's cleanup or an operator does: the container goes, then the data dir.
    await docker.getContainer(container!.Id).remove({ force: true });
    await rm(dataDir, { recursive: true, force: true });
    expect(mounted()).toBe(true);
    // Any later agent start on this host sweeps the mount whose image is gone.
    const next = createDockerWorkspaceBackend({ docker, hostId: orphanHost, workspaceRoot: path.join(root, "next"), diskQuotaBytes: QUOTA });
    await next.acquire(spec("next"), never);
    expect(mounted()).toBe(false);
    await next.reap(() => false);
    await next.close();
  });
});

describe.skipIf(skip)("docker hardening: quotas off", () => {
  it("a workspace without a quota is a plain folder the sandbox user can write, and the agent says quotas are off", async () => {
    const plainLogs: string[] = [];
    const plain = createDockerWorkspaceBackend({ docker, hostId, workspaceRoot: path.join(root, "plain"), diskQuotaBytes: 0, log: (m) => plainLogs.push(m) });
    expect(plainLogs.join("\n")).toMatch(/disk quotas are off/);
    await plain.acquire(spec("plain"), never);
    const out = await runCommand(plain, "plain", ["sh", "-c", "echo written > /workspace/a.txt && cat /workspace/a.txt && id -u"]);
    expect(out.result.exitCode).toBe(0);
    expect(out.stdout.split("\n").slice(0, 2)).toEqual(["written", "10001"]);
    const mountPoint = (await containerOf("plain")).Mounts.find((m) => m.Destination === "/workspace")!.Source;
    expect(mountPoint.startsWith(path.join(root, "plain"))).toBe(true);
    await plain.release("plain");
    await plain.close();
  });
});

describe.skipIf(skip)("docker hardening: quota after a host reboot", () => {
  it("a stopped workspace whose mount is gone gets its quota'd file system back before it starts", async () => {
    await backend.acquire(spec("reboot"), never);
    await backend.writeFile("reboot", "kept.txt", new TextEncoder().encode("kept"));
    const info = await containerOf("reboot");
    const mountPoint = info.Mounts.find((m) => m.Destination === "/workspace")!.Source;
    // What a reboot leaves: the container stopped, the mount (on /run) gone, the image kept.
    await docker.getContainer(info.Id).stop({ t: 0 });
    execFileSync("umount", [mountPoint]);
    await rm(mountPoint, { recursive: true, force: true });
    const restarted = createDockerWorkspaceBackend({ docker, hostId, workspaceRoot: path.join(root, "workspaces"), diskQuotaBytes: QUOTA });
    await restarted.acquire(spec("reboot"), never);
    const out = await runCommand(restarted, "reboot", ["sh", "-c", "cat kept.txt; echo; df -k /workspace | tail -n 1"]);
    expect(out.stdout.split("\n")[0]).toBe("kept");
    expect(Number(/^\S+\s+(\d+)/m.exec(out.stdout.split("\n")[1] ?? "")?.[1]) * 1024).toBeLessThanOrEqual(QUOTA);
    await restarted.release("reboot");
    await restarted.close();
  });
});

describe.skipIf(skip)("docker hardening: limits and settings", () => {
  it("ulimits nofile, nproc and fsize are visible inside", async () => {
    await backend.acquire(spec("limits"), never);
    const out = await runCommand(backend, "limits", ["sh", "-c", "ulimit -n; ulimit -u; ulimit -f; grep Seccomp: /proc/self/status"]);
    // busybox sh reports -f in 512-byte blocks; the largest file is the quota.
    expect(out.stdout.split("\n")).toEqual([String(NOFILE_LIMIT), String(NPROC_LIMIT), String(QUOTA / 512), "Seccomp:\t2", ""]);
    // A syscall the profile denies: a new user namespace.
    const unshare = await runCommand(backend, "limits", ["unshare", "-U", "true"]);
    expect(unshare.result.exitCode).not.toBe(0);
    expect(unshare.stderr).toMatch(/Operation not permitted/);
  });

  it("inspect shows the seccomp profile, CapDrop ALL, read-only root, no-new-privileges, a non-root user and the image by id", async () => {
    await backend.acquire(spec("inspect"), never);
    const info = await containerOf("inspect");
    const profile: unknown = JSON.parse(readFileSync(new URL("../sandbox-agent/seccomp/keel-workspace.json", import.meta.url), "utf8"));
    // The dockerode types leave SecurityOpt untyped; the engine sends strings.
    const securityOpt = (info.HostConfig.SecurityOpt ?? []) as string[];
    const seccomp = securityOpt.find((o) => o.startsWith("seccomp="));
    expect(seccomp).toBeDefined();
    expect(JSON.parse(seccomp!.slice("seccomp=".length))).toEqual(profile);
    expect(securityOpt).toContain("no-new-privileges");
    expect(info.HostConfig.CapDrop).toEqual(["ALL"]);
    expect(info.HostConfig.ReadonlyRootfs).toBe(true);
    expect(info.HostConfig.Privileged).toBe(false);
    expect(info.Config.User).toBe("10001:10001");
    const ulimits = Object.fromEntries((info.HostConfig.Ulimits ?? []).map((u): [string, number | undefined] => [u.Name ?? "", u.Hard]));
    expect(ulimits).toEqual({ nofile: NOFILE_LIMIT, nproc: NPROC_LIMIT, fsize: QUOTA });
    // Created by the id the tag resolved to, and the pin was logged.
    const image = await docker.getImage(IMAGE).inspect();
    expect(info.Config.Image).toBe(image.Id);
    expect(info.Image).toBe(image.Id);
    expect(logs.some((l) => l.includes(`image ${IMAGE} pinned to ${image.Id}`))).toBe(true);
  });
});

describe.skipIf(skip)("docker hardening: a granted network", () => {
  let hostServer: Server;
  let hostPort = 0;
  let control: Dockerode.Container | undefined;

  /** Whether a TCP connection from a workspace to host:port is accepted within 3 s. */
  async function connects(workspaceId: string, host: string, port: number): Promise<boolean> {
    const out = await runCommand(backend, workspaceId, ["sh", "-c", `nc -w 3 ${host} ${port} </dev/null; echo rc=$?`], { timeoutMs: 15_000 });
    return out.stdout.includes("rc=0");
  }

  /** The same from a plain container on Docker's default bridge: the positive control. */
  async function controlConnects(host: string, port: number): Promise<boolean> {
    const exec = await control!.exec({ Cmd: ["sh", "-c", `nc -w 3 ${host} ${port} </dev/null; echo rc=$?`], AttachStdout: true, AttachStderr: true });
    const stream = await exec.start({});
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    await new Promise((resolve) => stream.on("end", resolve));
    return Buffer.concat(chunks).toString("latin1").includes("rc=0");
  }

  function dropCount(range: string): number {
    const rules = execFileSync("iptables", ["-w", "-L", "DOCKER-USER", "-v", "-x", "-n"], { encoding: "utf8" });
    const line = rules.split("\n").find((l) => l.includes(WORKSPACE_BRIDGE) && l.includes(range) && l.includes("DROP"));
    if (line === undefined) throw new Error(`no DROP rule for ${range} on ${WORKSPACE_BRIDGE}:\n${rules}`);
    return Number(line.trim().split(/\s+/)[0]);
  }

  beforeAll(async () => {
    hostServer = createServer((socket) => socket.end("hello\n"));
    await new Promise<void>((resolve) => hostServer.listen(0, "0.0.0.0", resolve));
    hostPort = (hostServer.address() as { port: number }).port;
    await backend.acquire(spec("net-a", { networkAccess: true }), never);
    await backend.acquire(spec("net-b", { networkAccess: true }), never);
    control = await docker.createContainer({
      Image: IMAGE,
      Entrypoint: ["sleep", "600"],
      Labels: { [LABELS.hostId]: hostId },
      HostConfig: { NetworkMode: "bridge", AutoRemove: false },
    });
    await control.start();
  });

  afterAll(async () => {
    await control?.remove({ force: true }).catch(() => undefined);
    await new Promise((resolve) => hostServer.close(resolve));
  });

  it("is the dedicated network, with inter-container traffic off", async () => {
    const info = await containerOf("net-a");
    expect(info.HostConfig.NetworkMode).toBe(WORKSPACE_NETWORK);
    const network = await docker.getNetwork(WORKSPACE_NETWORK).inspect();
    expect(network.Options).toMatchObject({ "com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": WORKSPACE_BRIDGE });
    for (const range of BLOCKED_RANGES) expect(() => dropCount(range)).not.toThrow();
  });

  it("cannot reach another workspace container", async () => {
    const b = (await containerOf("net-b")).NetworkSettings.Networks[WORKSPACE_NETWORK]?.IPAddress ?? "";
    expect(b).not.toBe("");
    // b listens (in the background of a long command), and reaches itself: the listener works.
    const listening = runCommand(backend, "net-b", ["sh", "-c", "nc -ll -p 8080 -e echo hi"], { timeoutMs: 8000 });
    await new Promise((r) => setTimeout(r, 500));
    expect(await connects("net-b", b, 8080)).toBe(true);
    expect(await connects("net-a", b, 8080)).toBe(false);
    await listening;
  });

  it("cannot reach a port listening on the host, which a container on the default bridge reaches", async () => {
    const controlGateway = (await control!.inspect()).NetworkSettings.Networks["bridge"]?.Gateway ?? "";
    const ownGateway = (await containerOf("net-a")).NetworkSettings.Networks[WORKSPACE_NETWORK]?.Gateway ?? "";
    expect(controlGateway).not.toBe("");
    expect(ownGateway).not.toBe("");
    expect(await controlConnects(controlGateway, hostPort)).toBe(true);
    expect(await connects("net-a", ownGateway, hostPort)).toBe(false);
    expect(await connects("net-a", controlGateway, hostPort)).toBe(false);
  });

  it("cannot reach 169.254.169.254 (dropped by the link-local rule) nor a container on another bridge", async () => {
    const controlIp = (await control!.inspect()).NetworkSettings.Networks["bridge"]?.IPAddress ?? "";
    expect(await controlConnects("169.254.169.254", 80)).toBe(true);
    const droppedBefore = dropCount("169.254.0.0/16");
    expect(await connects("net-a", "169.254.169.254", 80)).toBe(false);
    expect(dropCount("169.254.0.0/16")).toBeGreaterThan(droppedBefore);
    const privateBefore = dropCount("172.16.0.0/12");
    expect(await connects("net-a", controlIp, 22)).toBe(false);
    expect(dropCount("172.16.0.0/12")).toBeGreaterThan(privateBefore);
  });
});
