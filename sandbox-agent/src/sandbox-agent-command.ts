// `keel sandbox-agent`: composes a sandbox host (its backend, its identity, its logger) and
// keeps it attached to the control plane until SIGINT or SIGTERM.

import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { cpus, hostname, totalmem } from "node:os";
import path from "node:path";
import { pino, type Level } from "pino";
import { slugProblem } from "../../common/ids.js";
import { plaintextUrlProblem } from "../../common/loopback.js";
import { createDockerWorkspaceBackend, DEFAULT_DISK_QUOTA_BYTES } from "./docker/docker-workspace-backend.js";
import { probeBubblewrap } from "./process/bubblewrap.js";
import { BUBBLEWRAP_MISSING, createProcessWorkspaceBackend } from "./process/process-workspace-backend.js";
import { createSandboxAgent, type AgentTlsMaterial } from "./sandbox-agent.js";
import type { WorkspaceBackend } from "./workspace-backend.js";

export const SANDBOX_AGENT_VERSION = "0.1.0";

export interface SandboxAgentCommandOptions {
  /** One control plane, or several replicas on one ledger separated by commas (tried in order). */
  readonly controlPlaneUrl: string;
  readonly token: string;
  readonly backend: "docker" | "process";
  readonly hostId: string | undefined;
  readonly capacity: number;
  /** "k=v" pairs. */
  readonly labels: readonly string[];
  readonly images: readonly string[];
  readonly warmPool: number;
  /** Disk quota per docker workspace in MiB; 0 turns quotas off (a command can then fill the host's disk). */
  readonly diskQuotaMib?: number;
  readonly dataDir: string;
  readonly logLevel: Level | "silent";
  /** Process backend only: run commands as plain child processes when there is no bubblewrap (unsafe). */
  readonly allowUnsandboxed?: boolean;
  readonly tls?: AgentTlsFiles;
}

/** File paths of the TLS flags (--ca, --tls-cert, --tls-key) and --insecure. */
export interface AgentTlsFiles {
  readonly caFile: string | undefined;
  readonly certFile: string | undefined;
  readonly keyFile: string | undefined;
  readonly insecure: boolean;
}

export class SandboxAgentUsageError extends Error {}

/** Checks the URL against the plaintext rule and reads the PEM files the flags name. */
export async function agentTlsMaterial(url: string, files: AgentTlsFiles | undefined): Promise<AgentTlsMaterial | undefined> {
  const problem = plaintextUrlProblem(url, files?.insecure ?? false);
  if (problem !== undefined) throw new SandboxAgentUsageError(`--control-plane: ${problem}`);
  if (files === undefined) return undefined;
  if ((files.certFile === undefined) !== (files.keyFile === undefined)) {
    throw new SandboxAgentUsageError("--tls-cert and --tls-key go together: a client certificate needs its key");
  }
  const read = async (flag: string, file: string | undefined) => {
    if (file === undefined) return {};
    try {
      return { [flag]: await readFile(file, "utf8") };
    } catch (error) {
      throw new SandboxAgentUsageError(`cannot read ${file}: ${error instanceof Error ? error.message : String(error)}`);
    }
  };
  const material = { ...(await read("ca", files.caFile)), ...(await read("cert", files.certFile)), ...(await read("key", files.keyFile)) };
  return Object.keys(material).length === 0 ? undefined : material;
}

function parseLabels(labels: readonly string[]): Record<string, string> {
  const parsed: Record<string, string> = {};
  for (const label of labels) {
    const at = label.indexOf("=");
    if (at <= 0) throw new SandboxAgentUsageError(`--label ${JSON.stringify(label)} must look like key=value`);
    parsed[label.slice(0, at)] = label.slice(at + 1);
  }
  return parsed;
}

function requireHostId(field: string, value: string): string {
  const problem = slugProblem(value);
  if (problem !== undefined) throw new Error(`${field}: ${problem}`);
  return value;
}

/** The host id: given, or made once and kept in the data folder so a restarted agent is the same host. */
async function hostIdentity(dataDir: string, given: string | undefined): Promise<string> {
  if (given !== undefined) return requireHostId("--host-id", given);
  const file = path.join(dataDir, "host-id");
  if (existsSync(file)) return requireHostId(file, (await readFile(file, "utf8")).trim());
  const base = hostname().toLowerCase().replace(/[^a-z0-9._-]/g, "-").replace(/^[^a-z0-9]+/, "").slice(0, 48) || "host";
  const id = `${base}-${randomBytes(3).toString("hex")}`;
  await writeFile(file, `${id}\n`);
  return id;
}

export async function sandboxAgentCommand(options: SandboxAgentCommandOptions): Promise<number> {
  if (!Number.isInteger(options.capacity) || options.capacity < 1 || options.capacity > 10_000) {
    throw new SandboxAgentUsageError("--capacity must be a whole number of workspaces, 1 to 10000");
  }
  if (!Number.isInteger(options.warmPool) || options.warmPool < 0 || options.warmPool > 100) {
    throw new SandboxAgentUsageError("--warm-pool must be 0 to 100 containers");
  }
  const diskQuotaMib = options.diskQuotaMib ?? DEFAULT_DISK_QUOTA_BYTES / 1024 ** 2;
  if (!Number.isInteger(diskQuotaMib) || (diskQuotaMib !== 0 && (diskQuotaMib < 16 || diskQuotaMib > 1024 ** 2))) {
    throw new SandboxAgentUsageError("--disk-quota-mib must be 0 (no quota) or 16 to 1048576 MiB per workspace");
  }
  if (options.token === "") throw new SandboxAgentUsageError("a sandbox-host token is required: --token T or KEEL_SANDBOX_TOKEN");
  const controlPlanes = options.controlPlaneUrl
    .split(",")
    .map((url) => url.trim())
    .filter((url) => url !== "");
  const [controlPlaneUrl, ...moreControlPlaneUrls] = controlPlanes;
  if (controlPlaneUrl === undefined) throw new SandboxAgentUsageError("--control-plane names no URL");
  let tls: AgentTlsMaterial | undefined;
  for (const url of controlPlanes) tls = await agentTlsMaterial(url, options.tls);
  const labels = parseLabels(options.labels);
  const dataDir = path.resolve(options.dataDir);
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  const hostId = await hostIdentity(dataDir, options.hostId);
  const log = pino({ level: options.logLevel, base: { service: "keel-sandbox-agent", hostId } });
  const workspaceRoot = path.join(dataDir, "workspaces");
  const backendLog = (message: string) => log.info({ component: options.backend }, message);

  let backend: WorkspaceBackend;
  if (options.backend === "docker") {
    const image = options.images[0];
    backend = createDockerWorkspaceBackend({
      hostId,
      workspaceRoot,
      diskQuotaBytes: diskQuotaMib * 1024 ** 2,
      log: backendLog,
      ...(options.warmPool > 0 && image !== undefined ? { warmPool: [{ image, size: options.warmPool }] } : {}),
    });
  } else {
    // Fail closed: without a working bubblewrap the agent does not start unless told to run unsandboxed.
    if (options.allowUnsandboxed === true) {
      log.warn(
        "UNSANDBOXED: --allow-unsandboxed runs every workspace command as a plain child process of this agent, with its user, " +
          "files, network and process table (its token in /proc, the host's loopback). Use it for trusted workloads only.",
      );
    } else if ((await probeBubblewrap()) === undefined) {
      throw new Error(BUBBLEWRAP_MISSING);
    }
    backend = createProcessWorkspaceBackend({ workspaceRoot, hostId, log: backendLog, sandbox: options.allowUnsandboxed === true ? "none" : "bubblewrap" });
  }

  const agent = createSandboxAgent({
    controlPlaneUrl,
    moreControlPlaneUrls,
    ...(tls === undefined ? {} : { tls }),
    token: options.token,
    hostId,
    capacity: options.capacity,
    labels,
    images: options.images,
    backend,
    log,
    agentVersion: SANDBOX_AGENT_VERSION,
    cpuMillis: cpus().length * 1000,
    memoryBytes: totalmem(),
  });
  log.info(
    { controlPlanes, backend: options.backend, capacity: options.capacity, labels, images: options.images, instanceId: agent.instanceId },
    "sandbox agent starting",
  );
  const stop = (signal: string) => {
    log.info({ signal }, "stopping");
    void agent.stop();
  };
  process.once("SIGINT", () => stop("SIGINT"));
  process.once("SIGTERM", () => stop("SIGTERM"));
  await agent.run();
  await agent.stop();
  return 0;
}
