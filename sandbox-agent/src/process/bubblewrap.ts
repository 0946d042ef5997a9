// Bubblewrap for the process backend: whether `bwrap` is installed and can make the sandbox
// (probed once per process), and the argv that runs one command inside it.
import { spawn } from "node:child_process";
import { constants as fsConstants } from "node:fs";
import { access, lstat, readlink } from "node:fs/promises";
import path from "node:path";
import { WORKSPACE_MOUNT } from "../workspace-folder.js";

const SYSTEM_FOLDERS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"];
// Only what programs need from /etc: not /etc as a whole (it may hold host secrets, and
// inside the sandbox the command's uid can map to the agent's own).
const ETC_FILES = [
  "/etc/passwd",
  "/etc/group",
  "/etc/nsswitch.conf",
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/alternatives",
  "/etc/localtime",
  "/etc/ssl",
  "/etc/ca-certificates",
  "/etc/hosts",
];

export interface Bubblewrap {
  readonly binary: string;
  /** Binds of the system folders, computed once. */
  readonly systemArgs: readonly string[];
  readonly supportsSize: boolean;
}

let bubblewrapProbe: Promise<Bubblewrap | undefined> | undefined;

async function findOnPath(binary: string): Promise<string | undefined> {
  for (const dir of (process.env.PATH ?? "/usr/bin:/bin").split(":")) {
    if (dir === "") continue;
    const candidate = path.join(dir, binary);
    try {
      await access(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

async function systemBindArgs(): Promise<string[]> {
  const args: string[] = [];
  for (const folder of SYSTEM_FOLDERS) {
    const stats = await lstat(folder).catch(() => undefined);
    if (stats === undefined) continue;
    if (stats.isSymbolicLink()) args.push("--symlink", await readlink(folder), folder);
    else if (stats.isDirectory()) args.push("--ro-bind", folder, folder);
  }
  for (const file of ETC_FILES) args.push("--ro-bind-try", file, file);
  return args;
}

function runQuietly(binary: string, args: readonly string[], timeoutMs: number): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin" } });
    let output = "";
    const keep = (chunk: Buffer): void => {
      if (output.length < 65_536) output += chunk.toString("utf8");
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("error", () => {
      clearTimeout(timer);
      resolve({ code: null, output });
    });
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

/** Whether bubblewrap is installed and can make the sandbox this backend needs (cached). */
export function detectBubblewrap(): Promise<boolean> {
  return probeBubblewrap().then((b) => b !== undefined);
}

export function probeBubblewrap(): Promise<Bubblewrap | undefined> {
  bubblewrapProbe ??= (async () => {
    const binary = await findOnPath("bwrap");
    if (binary === undefined) return undefined;
    const systemArgs = await systemBindArgs();
    const help = await runQuietly(binary, ["--help"], 5_000);
    const supportsSize = help.output.includes("--size");
    const probe = await runQuietly(
      binary,
      ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", ...systemArgs, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "sh", "-c", "exit 0"],
      5_000,
    );
    return probe.code === 0 ? { binary, systemArgs, supportsSize } : undefined;
  })();
  return bubblewrapProbe;
}

/**
 * The bwrap argv for one command: new user, pid, ipc, uts, cgroup and network namespaces, no
 * capabilities, read-only system folders, a private /tmp and a fresh /proc (only the command's
 * own processes: not the agent's environ), and the workspace's files bound read-write at
 * /workspace. The network namespace is never the host's: its only interface is a loopback of
 * its own, so nothing listening on the host (the control plane, PostgreSQL) is reachable.
 * The environment is the one bwrap itself is spawned with (process-exec.ts builds it from the
 * workspace's and the request's variables only); it is not passed as --setenv arguments, which
 * any local user could read from bwrap's command line.
 */
export function bubblewrapArgs(
  bwrap: Bubblewrap,
  sandbox: { readonly tmpfsBytes: number; readonly files: string; readonly workingDirectory: string },
  argv: readonly string[],
): string[] {
  return [
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    ...bwrap.systemArgs,
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    ...(bwrap.supportsSize ? ["--size", String(sandbox.tmpfsBytes)] : []),
    "--tmpfs",
    "/tmp",
    "--bind",
    sandbox.files,
    WORKSPACE_MOUNT,
    "--chdir",
    sandbox.workingDirectory,
    "--",
    ...argv,
  ];
}
