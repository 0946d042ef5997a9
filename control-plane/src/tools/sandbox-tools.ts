// Exec-class tools: they run in the run's own sandbox workspace, never in the control plane.
// Paths stay inside /workspace; output streams into the ledger as observations while the
// command runs; what the model is shown is bounded (the tail of the output and the exit code).

import { z } from "zod";
import { execEffect, grantedSecrets, redactSecrets, resolveWorkspacePath, storableText, WORKSPACE_ROOT } from "../domain/sandbox.js";
import type { SandboxDispatcher, SandboxExecResult, WorkspaceGrant } from "./sandbox-dispatcher.js";
import { defineTool, type ToolDefinition, type ToolExecutionContext, type ToolResult } from "./tool-registry.js";

export interface SandboxToolOptions {
  readonly dispatcher: SandboxDispatcher;
  /** The control plane's environment: where granted secrets are read from. */
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly defaultExecTimeoutMs: number;
  readonly maxExecTimeoutMs: number;
  readonly maxOutputBytes: number;
}

const DEFAULT_READ_BYTES = 64 * 1024;
const MAX_READ_BYTES = 1024 * 1024;
const MAX_WRITE_BYTES = 1024 * 1024;
const MAX_LISTED_ENTRIES = 500;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

/** A path the schema already accepted, resolved (the schema check and this one are the same rule). */
function resolved(path: string): string {
  const result = resolveWorkspacePath(path);
  if (!result.ok) throw new Error(`path ${result.reason}`);
  return result.path;
}

/**
 * Paths are checked when the call is validated (a traversal is refused before anything runs)
 * and stored resolved, so policy path rules and the ledger see the path that is actually used.
 */
const workspacePath = (what: string) =>
  z
    .string()
    .max(4096)
    .refine((value) => resolveWorkspacePath(value).ok, { message: `${what} must stay inside ${WORKSPACE_ROOT} (no traversal, no other roots)` })
    .transform(resolved)
    .describe(`${what}: absolute under ${WORKSPACE_ROOT}, or relative to it`);

/** The run's workspace grant: its agent's sandbox settings and the values of the secrets it names. */
export function grantFor(context: Pick<ToolExecutionContext, "runId" | "agent">, env: Readonly<Record<string, string | undefined>>): WorkspaceGrant {
  const secrets: Record<string, string> = {};
  const secretSources: Record<string, string> = {};
  for (const secret of context.agent.sandbox.secrets) {
    const value = env[secret.sourceEnv];
    if (value === undefined || value === "") {
      throw new Error(`agent ${context.agent.id} grants secret ${secret.envVar} from ${secret.sourceEnv}, which is not set in the control plane's environment`);
    }
    secrets[secret.envVar] = value;
    secretSources[secret.envVar] = secret.sourceEnv;
  }
  return {
    runId: context.runId,
    agentId: context.agent.id,
    image: context.agent.sandbox.image,
    labels: context.agent.sandbox.labels,
    networkAccess: context.agent.policy.networkAccess,
    secrets,
    secretSources,
  };
}

/** The bounded text the model sees for an exec: how it ended, then the tail of its output. */
export function execResultText(result: SandboxExecResult, maxOutputBytes: number): string {
  const notes = [`exit code ${result.exitCode}`, `${result.durationMs} ms`];
  if (result.timedOut) notes.push("timed out and was killed");
  if (result.outputTruncated) notes.push(`output truncated at ${maxOutputBytes} bytes`);
  const head = notes.join("; ");
  if (result.outputBytes === 0) return `${head}\n(no output)`;
  const tailBytes = Buffer.byteLength(result.outputTail);
  const label = tailBytes < result.outputBytes ? `--- last ${tailBytes} of ${result.outputBytes} output bytes ---` : "--- output ---";
  return `${head}\n${label}\n${result.outputTail}`;
}

function execToolResult(result: SandboxExecResult, maxOutputBytes: number): ToolResult {
  return {
    ok: result.exitCode === 0 && !result.timedOut,
    text: execResultText(result, maxOutputBytes),
    exitCode: result.exitCode,
    truncated: result.outputTruncated,
  };
}

async function noteTruncation(result: SandboxExecResult, context: Pick<ToolExecutionContext, "observe">, maxOutputBytes: number): Promise<void> {
  if (result.outputTruncated) await context.observe("keel", `[output truncated: only the first ${maxOutputBytes} bytes were kept]`);
}

/**
 * Path-prefix rules match the path as written, but a folder on it that is a symbolic link can
 * lead anywhere in the workspace (/workspace/public/link/secret). Under a rule for `path`, every
 * folder on the path (and, when `includeLast`, the name itself) is checked with the host not to
 * be a link before the call goes out; the host's listing reports links as "other".
 */
async function refuseLinksUnderPathRules(
  dispatcher: SandboxDispatcher,
  context: ToolExecutionContext,
  workspaceId: string,
  path: string,
  includeLast: boolean,
): Promise<void> {
  const policy = context.agent.policy;
  if (policy.kind === "allow_all" || !policy.pathRules.some((rule) => rule.field === "path")) return;
  const segments = path.slice(WORKSPACE_ROOT.length).split("/").filter((s) => s !== "");
  const checked = includeLast ? segments.length : segments.length - 1;
  for (let i = 0; i < checked; i++) {
    const folder = [WORKSPACE_ROOT, ...segments.slice(0, i)].join("/");
    const entry = (await dispatcher.listFiles(workspaceId, folder, context.signal)).find((e) => e.path === `${folder}/${segments[i]}`);
    if (entry === undefined) return; // nothing there yet: the call reports it, or a write makes real folders
    if (entry.type === "other") {
      throw new Error(`path ${path} goes through ${entry.path}, which is a link or special file; this agent's path rules allow only real paths`);
    }
  }
}

export function createSandboxTools(options: SandboxToolOptions): ToolDefinition[] {
  const { dispatcher, env } = options;

  const inWorkspace = async <T>(context: ToolExecutionContext, work: (workspaceId: string, grant: WorkspaceGrant) => Promise<T>): Promise<T> => {
    const grant = grantFor(context, env);
    const workspaceId = await dispatcher.workspaceFor(grant, context.signal);
    return work(workspaceId, grant);
  };

  type ExecArgs = { command: string; working_directory?: string; env?: Record<string, string>; timeout_ms?: number };
  const exec = defineTool<ExecArgs>({
    name: "sandbox.exec",
    version: 1,
    description:
      `Run a shell command (sh -c) in this run's sandbox workspace, in ${WORKSPACE_ROOT} unless working_directory says otherwise. ` +
      "Returns the exit code and the end of the output; the full output is kept in the run's ledger.",
    parameters: z.object({
      command: z.string().min(1).max(64 * 1024).describe("The shell command"),
      working_directory: workspacePath("working_directory").optional(),
      env: z
        .record(z.string().regex(ENV_NAME, "must be an environment variable name"), z.string().max(32 * 1024))
        .refine((vars) => Object.keys(vars).length <= 64, { message: "at most 64 variables" })
        .optional()
        .describe("Extra environment variables for this command"),
      timeout_ms: z.number().int().min(1).max(options.maxExecTimeoutMs).optional().describe(`Kill the command after this long (default ${options.defaultExecTimeoutMs})`),
    }),
    effect: (args, grant) => execEffect(args.command, grant, args.env),
    async execute(args, context) {
      return inWorkspace(context, async (workspaceId) => {
        const result = await dispatcher.exec(
          workspaceId,
          context.invocationId,
          {
            argv: ["sh", "-c", args.command],
            workingDirectory: resolved(args.working_directory ?? WORKSPACE_ROOT),
            env: args.env ?? {},
            timeoutMs: args.timeout_ms ?? options.defaultExecTimeoutMs,
            maxOutputBytes: options.maxOutputBytes,
            ...(context.leaseEpoch === undefined ? {} : { leaseEpoch: context.leaseEpoch }),
          },
          (stream, text) => context.observe(stream, text),
          context.signal,
        );
        await noteTruncation(result, context, options.maxOutputBytes);
        return execToolResult(result, options.maxOutputBytes);
      });
    },
    async reattach(_args, context) {
      const result = await dispatcher.reattach(grantFor(context, env), context.invocationId, (stream, text) => context.observe(stream, text), context.signal);
      if (result === undefined) return undefined;
      await noteTruncation(result, context, options.maxOutputBytes);
      return execToolResult(result, options.maxOutputBytes);
    },
  });

  const readFile = defineTool<{ path: string; max_bytes?: number }>({
    name: "sandbox.read_file",
    version: 1,
    description: `Read a text file from this run's sandbox workspace (${WORKSPACE_ROOT}).`,
    parameters: z.object({
      path: workspacePath("path"),
      max_bytes: z.number().int().min(1).max(MAX_READ_BYTES).optional().describe(`Read at most this many bytes (default ${DEFAULT_READ_BYTES})`),
    }),
    effect: "read",
    async execute(args, context) {
      return inWorkspace(context, async (workspaceId, grant) => {
        const maxBytes = args.max_bytes ?? DEFAULT_READ_BYTES;
        await refuseLinksUnderPathRules(dispatcher, context, workspaceId, resolved(args.path), true);
        // A file larger than max_bytes is refused by the host (too_large), never silently cut.
        const data = await dispatcher.readFile(workspaceId, resolved(args.path), maxBytes, context.signal);
        return { ok: true, text: storableText(redactSecrets(new TextDecoder().decode(data), grantedSecrets(grant.secrets))) };
      });
    },
  });

  const writeFile = defineTool<{ path: string; content: string }>({
    name: "sandbox.write_file",
    version: 1,
    description: `Write a text file in this run's sandbox workspace (${WORKSPACE_ROOT}), creating folders as needed and replacing any file there.`,
    parameters: z.object({
      path: workspacePath("path"),
      content: z.string().refine((text) => Buffer.byteLength(text) <= MAX_WRITE_BYTES, { message: `at most ${MAX_WRITE_BYTES} bytes` }),
    }),
    effect: "write",
    async execute(args, context) {
      return inWorkspace(context, async (workspaceId) => {
        const path = resolved(args.path);
        const content = new TextEncoder().encode(args.content);
        // The name itself may be a link: a write replaces it, never writes through it.
        await refuseLinksUnderPathRules(dispatcher, context, workspaceId, path, false);
        await dispatcher.writeFile(workspaceId, path, content, context.signal, context.leaseEpoch);
        return { ok: true, text: `wrote ${content.byteLength} bytes to ${path}` };
      });
    },
  });

  const listFiles = defineTool<{ path: string }>({
    name: "sandbox.list_files",
    version: 1,
    description: `List a folder in this run's sandbox workspace (${WORKSPACE_ROOT}).`,
    parameters: z.object({ path: workspacePath("path") }),
    effect: "read",
    async execute(args, context) {
      return inWorkspace(context, async (workspaceId, grant) => {
        const path = resolved(args.path);
        await refuseLinksUnderPathRules(dispatcher, context, workspaceId, path, true);
        const entries = await dispatcher.listFiles(workspaceId, path, context.signal);
        if (entries.length === 0) return { ok: true, text: `${path} is empty` };
        const shown = entries.slice(0, MAX_LISTED_ENTRIES).map((e) => `${e.type === "directory" ? "d" : e.type === "file" ? "-" : "?"} ${e.sizeBytes} ${e.path}`);
        if (entries.length > shown.length) shown.push(`... and ${entries.length - shown.length} more`);
        return { ok: true, text: storableText(redactSecrets(shown.join("\n"), grantedSecrets(grant.secrets))), truncated: entries.length > MAX_LISTED_ENTRIES };
      });
    },
  });

  return [exec, readFile, writeFile, listFiles];
}
