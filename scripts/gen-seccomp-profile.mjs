#!/usr/bin/env node
// Writes sandbox-agent/seccomp/keel-workspace.json: an allow-list seccomp profile for Docker
// workspaces. Every x86_64 syscall the kernel headers name is allowed except DENIED below, clone
// is allowed only without namespace flags, clone3 answers ENOSYS (so libc falls back to clone,
// whose flags a filter can read) and personality only with harmless personas. Anything not
// listed, and every 32-bit or x32 syscall, fails with EPERM. Rerun after a kernel header update.
import { readFileSync, writeFileSync } from "node:fs";

// What a workspace never needs; docs/security.md ("Docker workspaces") gives the reasons.
const DENIED = {
  mounts: ["mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"],
  namespaces: ["unshare", "setns"],
  kernelSurface: ["bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_secret"],
  otherProcesses: ["ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise", "process_mrelease"],
  keyrings: ["add_key", "request_key", "keyctl"],
  hostAdmin: [
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "nfsservctl",
    "lookup_dcookie", "_sysctl", "uselib", "ustat", "sysfs", "vhangup", "iopl", "ioperm", "modify_ldt",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "fanotify_mark",
  ],
  numaPlacement: ["mbind", "set_mempolicy", "migrate_pages", "move_pages", "set_mempolicy_home_node"],
  unimplemented: ["afs_syscall", "tuxcall", "security", "getpmsg", "putpmsg", "vserver", "epoll_ctl_old", "epoll_wait_old"],
  filteredBelow: ["clone", "clone3", "personality"],
};

const header = readFileSync(process.argv[2] ?? "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "utf8");
const all = [...header.matchAll(/#define __NR_(\w+) \d+/g)].map((m) => m[1]);
const denied = new Set(Object.values(DENIED).flat());
const allowed = all.filter((name) => !denied.has(name)).sort();

// CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET and CLONE_NEWTIME.
const namespaceFlags = 0x7e020000 | 0x80;
const EPERM = 1;
const ENOSYS = 38;
const profile = {
  defaultAction: "SCMP_ACT_ERRNO",
  defaultErrnoRet: EPERM,
  archMap: [
    { architecture: "SCMP_ARCH_X86_64", subArchitectures: [] },
    { architecture: "SCMP_ARCH_AARCH64", subArchitectures: [] },
  ],
  syscalls: [
    { names: allowed, action: "SCMP_ACT_ALLOW" },
    { names: ["clone"], action: "SCMP_ACT_ALLOW", args: [{ index: 0, value: namespaceFlags, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ" }] },
    { names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: ENOSYS },
    // PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query value.
    ...[0x0, 0x8, 0x20000, 0x20008, 0xffffffff].map((value) => ({
      names: ["personality"],
      action: "SCMP_ACT_ALLOW",
      args: [{ index: 0, value, valueTwo: 0, op: "SCMP_CMP_EQ" }],
    })),
  ],
};
const out = new URL("../sandbox-agent/seccomp/keel-workspace.json", import.meta.url);
writeFileSync(out, `${JSON.stringify(profile, null, 1)}\n`);
console.log(`gen-seccomp-profile: ${allowed.length} syscalls allowed, ${denied.size} denied or filtered; wrote ${out.pathname}`);
