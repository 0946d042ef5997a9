// The workspace container's configuration as data: the seccomp profile allows what commands
// need and denies what they never need, the ulimits and network follow the arguments.
import { describe, expect, it } from "vitest";
import { DEFAULT_WORKSPACE_LIMITS } from "../workspace-backend.js";
import { hardenedContainerConfig, NOFILE_LIMIT, SECCOMP_PROFILE } from "./container-config.js";
import { BLOCKED_RANGES, firewallRules, WORKSPACE_BRIDGE, WORKSPACE_NETWORK } from "./workspace-network.js";

interface Rule {
  names: string[];
  action: string;
  errnoRet?: number;
  args?: { index: number; value: number; op: string }[];
}
const profile = JSON.parse(SECCOMP_PROFILE) as { defaultAction: string; defaultErrnoRet: number; syscalls: Rule[] };
const unconditional = new Set(profile.syscalls.filter((r) => r.action === "SCMP_ACT_ALLOW" && r.args === undefined).flatMap((r) => r.names));

describe("seccomp profile", () => {
  it("refuses anything unlisted with EPERM", () => {
    expect(profile.defaultAction).toBe("SCMP_ACT_ERRNO");
    expect(profile.defaultErrnoRet).toBe(1);
  });

  it("allows what shells, compilers and package managers use", () => {
    for (const name of ["read", "write", "openat", "execve", "wait4", "pipe2", "socket", "connect", "mmap", "futex", "rename", "statx", "getdents64", "vfork"]) {
      expect(unconditional, name).toContain(name);
    }
  });

  it("denies mounts, namespaces, kernel attack surface and reaching into other processes", () => {
    for (const name of ["mount", "umount2", "pivot_root", "fsopen", "unshare", "setns", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "ptrace", "process_vm_readv", "keyctl", "add_key", "open_by_handle_at", "init_module", "kexec_load", "reboot"]) {
      expect(unconditional, name).not.toContain(name);
      expect(profile.syscalls.some((r) => r.names.includes(name) && r.action === "SCMP_ACT_ALLOW"), name).toBe(false);
    }
  });

  it("allows clone only without namespace flags, and clone3 answers ENOSYS", () => {
    const clone = profile.syscalls.filter((r) => r.names.includes("clone"));
    expect(clone).toHaveLength(1);
    expect(clone[0]!.args).toEqual([{ index: 0, value: 0x7e020080, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ" }]);
    expect(profile.syscalls.find((r) => r.names.includes("clone3"))).toMatchObject({ action: "SCMP_ACT_ERRNO", errnoRet: 38 });
  });
});

describe("hardenedContainerConfig", () => {
  const base = { image: "sha256:" + "a".repeat(64), limits: DEFAULT_WORKSPACE_LIMITS, hostFolder: "/x", hostId: "h", workspaceLabel: "w", runId: "r", warm: false };

  it("passes the profile, ulimits and the I/O weight", () => {
    const config = hardenedContainerConfig({ ...base, networkAccess: false, maxFileBytes: 1234567 });
    expect(config.HostConfig?.SecurityOpt).toEqual(["no-new-privileges", `seccomp=${SECCOMP_PROFILE}`]);
    expect(config.HostConfig?.Ulimits).toContainEqual({ Name: "fsize", Soft: 1234567, Hard: 1234567 });
    expect(config.HostConfig?.Ulimits).toContainEqual({ Name: "nofile", Soft: NOFILE_LIMIT, Hard: NOFILE_LIMIT });
    expect(config.HostConfig?.BlkioWeight).toBeGreaterThan(0);
    expect(config.HostConfig?.NetworkMode).toBe("none");
  });

  it("puts a granted workspace on the dedicated network, never the default bridge", () => {
    expect(hardenedContainerConfig({ ...base, networkAccess: true }).HostConfig?.NetworkMode).toBe(WORKSPACE_NETWORK);
  });
});

describe("firewall rules", () => {
  it("drop every blocked range forwarded from the bridge, and everything to the host", () => {
    const rules = firewallRules();
    for (const range of ["169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]) expect(BLOCKED_RANGES).toContain(range);
    for (const range of BLOCKED_RANGES) {
      expect(rules).toContainEqual({ chain: "DOCKER-USER", rule: ["-i", WORKSPACE_BRIDGE, "-d", range, "-j", "DROP"] });
    }
    expect(rules).toContainEqual({ chain: "INPUT", rule: ["-i", WORKSPACE_BRIDGE, "-j", "DROP"] });
  });
});
