// A join node over inputs that ran in workspaces of their own (issue #14 item 4): it reads the
// files each input's child run left in its workspace, applies them in input order to the root
// run's workspace (domain/workspace-merge.ts decides what wins) and reports what it applied and
// what conflicted. It only reads the inputs' workspaces and writes the same bytes to the root's,
// so a reconciliation cut short by a crash is simply done again.
import { createHash } from "node:crypto";
import { WORKSPACE_ROOT } from "../domain/sandbox.js";
import { combineOutputs } from "../domain/work-graph-schedule.js";
import { describeMerge, mergeWorkspaces, type InputWorkspace } from "../domain/workspace-merge.js";
import type { JoinJob, JoinSettlement } from "./work-graph-ledger.js";

/** The sandbox fleet as a join uses it; the composition root builds each run's grant. */
export interface JoinWorkspaces {
  /** The run's workspace if it has one; never places a new one. */
  existing(runId: string, agentId: string, signal: AbortSignal): Promise<string | undefined>;
  /** The run's workspace, placed on a host if it has none yet. */
  open(runId: string, agentId: string, signal: AbortSignal): Promise<string>;
  listFiles(workspaceId: string, path: string, signal: AbortSignal): Promise<readonly { path: string; type: string; sizeBytes: number }[]>;
  readFile(workspaceId: string, path: string, maxBytes: number, signal: AbortSignal): Promise<Uint8Array>;
  writeFile(workspaceId: string, path: string, content: Uint8Array, signal: AbortSignal): Promise<void>;
}

/** What one reconciliation may carry: bounded, so a runaway branch fails its join instead of the control plane. */
export interface JoinLimits {
  readonly maxFiles: number;
  readonly maxFileBytes: number;
  readonly maxTotalBytes: number;
}

export const DEFAULT_JOIN_LIMITS: JoinLimits = { maxFiles: 1_000, maxFileBytes: 4 * 1024 * 1024, maxTotalBytes: 32 * 1024 * 1024 };

const MAX_DEPTH = 32;

interface ReadWorkspace extends InputWorkspace {
  readonly contents: ReadonlyMap<string, Uint8Array>;
}

export function createWorkspaceJoin(workspaces: JoinWorkspaces, limits: JoinLimits = DEFAULT_JOIN_LIMITS) {
  /** Every regular file under /workspace, read whole; links and special files are listed as skipped. */
  const readInput = async (key: string, workspaceId: string, carried: { bytes: number }, signal: AbortSignal): Promise<ReadWorkspace> => {
    const files: InputWorkspace["files"][number][] = [];
    const skipped: string[] = [];
    const contents = new Map<string, Uint8Array>();
    const folders: { path: string; depth: number }[] = [{ path: WORKSPACE_ROOT, depth: 0 }];
    while (folders.length > 0) {
      const folder = folders.shift()!;
      const entries = await workspaces.listFiles(workspaceId, folder.path, signal);
      signal.throwIfAborted();
      for (const entry of entries) {
        if (entry.type === "directory") {
          if (folder.depth + 1 > MAX_DEPTH) throw new Error(`"${key}" left folders nested deeper than ${MAX_DEPTH} (${entry.path})`);
          folders.push({ path: entry.path, depth: folder.depth + 1 });
          continue;
        }
        if (entry.type !== "file") {
          skipped.push(entry.path);
          continue;
        }
        if (files.length + 1 > limits.maxFiles) throw new Error(`"${key}" left more than ${limits.maxFiles} files`);
        if (entry.sizeBytes > limits.maxFileBytes) throw new Error(`"${key}" left ${entry.path} of ${entry.sizeBytes} bytes, over the ${limits.maxFileBytes}-byte limit per file`);
        carried.bytes += entry.sizeBytes;
        if (carried.bytes > limits.maxTotalBytes) throw new Error(`the inputs left more than ${limits.maxTotalBytes} bytes in all`);
        const data = await workspaces.readFile(workspaceId, entry.path, limits.maxFileBytes, signal);
        contents.set(entry.path, data);
        files.push({ path: entry.path, sha256: createHash("sha256").update(data).digest("hex"), sizeBytes: data.byteLength });
      }
    }
    return { key, files, skipped, contents };
  };

  /** Reconciles one join; a refusal or a fault fails the join with why, and only a stop leaves it for later. */
  return async function reconcile(job: JoinJob, signal: AbortSignal): Promise<JoinSettlement> {
    const carried = { bytes: 0 };
    try {
      const inputs: ReadWorkspace[] = [];
      for (const input of job.inputs) {
        if (input.workspace === "none" || input.childRunId === undefined) continue;
        const workspaceId = input.workspace === "active" ? await workspaces.existing(input.childRunId, job.agentId, signal) : undefined;
        if (workspaceId === undefined) throw new Error(`the workspace of "${input.key}" is gone (released, or lost with its host), so its files cannot be carried`);
        inputs.push(await readInput(input.key, workspaceId, carried, signal));
      }
      const merge = mergeWorkspaces(inputs);
      if (merge.apply.length > 0) {
        const target = await workspaces.open(job.rootRunId, job.agentId, signal);
        for (const file of merge.apply) {
          const content = inputs.find((input) => input.key === file.from)!.contents.get(file.path)!;
          await workspaces.writeFile(target, file.path, content, signal);
        }
      }
      const report = describeMerge(inputs, merge);
      const outputs = combineOutputs(job.inputs.map((input) => ({ key: input.key, output: input.output })));
      return { nodeId: job.nodeId, key: job.key, status: "succeeded", output: `${report}\n\n${outputs}` };
    } catch (error) {
      signal.throwIfAborted();
      const why = error instanceof Error ? error.message : String(error);
      return { nodeId: job.nodeId, key: job.key, status: "failed", output: `could not reconcile the inputs' workspaces: ${why}` };
    }
  };
}

export type WorkspaceJoin = ReturnType<typeof createWorkspaceJoin>;
