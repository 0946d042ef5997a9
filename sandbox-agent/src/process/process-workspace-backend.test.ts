import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll } from "vitest";
import { describeWorkspaceBackendContract } from "../workspace-backend.contract.js";
import { detectBubblewrap } from "./bubblewrap.js";
import { createProcessWorkspaceBackend } from "./process-workspace-backend.js";

const roots: string[] = [];
afterAll(async () => {
  for (const root of roots) await rm(root, { recursive: true, force: true });
});

async function make(sandbox: "none" | "bubblewrap") {
  const root = await mkdtemp(path.join(tmpdir(), "keel-process-ws-"));
  roots.push(root);
  return createProcessWorkspaceBackend({ workspaceRoot: root, hostId: `test-host-${sandbox}`, sandbox });
}

// Plain child processes: commands share the host's filesystem (documented weaker isolation).
describeWorkspaceBackendContract("process (plain child processes)", () => make("none"), {
  sharesHostFilesystem: "plain child processes run on the host's filesystem; only bubblewrap hides other workspaces",
});

// Under bubblewrap when it is installed here (apt-get install -y bubblewrap).
const bubblewrap = await detectBubblewrap();
describeWorkspaceBackendContract("process (bubblewrap)", () => make("bubblewrap"), {
  ...(bubblewrap ? {} : { skip: "bubblewrap (bwrap) is not installed or cannot make namespaces here" }),
});
