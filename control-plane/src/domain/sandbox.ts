// Sandbox rules in domain terms: where a workspace path may point, which commands count as
// reads, and how granted secrets are kept out of everything Keel stores or logs.

import type { ToolEffect, ToolGrant } from "./agent.js";

export const WORKSPACE_ROOT = "/workspace";

export type WorkspacePath = { readonly ok: true; readonly path: string } | { readonly ok: false; readonly reason: string };

/**
 * Resolves a path given by a model against /workspace (relative paths are inside it) and
 * refuses anything that lands outside it once `.` and `..` are applied.
 */
export function resolveWorkspacePath(input: string): WorkspacePath {
  if (input.includes("\0")) return { ok: false, reason: "must not contain NUL bytes" };
  if (input.trim() === "") return { ok: false, reason: "is empty" };
  const absolute = input.startsWith("/") ? input : `${WORKSPACE_ROOT}/${input}`;
  const parts: string[] = [];
  for (const part of absolute.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (parts.length === 0) return { ok: false, reason: `${JSON.stringify(input)} escapes ${WORKSPACE_ROOT}` };
      parts.pop();
      continue;
    }
    parts.push(part);
  }
  const resolved = `/${parts.join("/")}`;
  if (resolved !== WORKSPACE_ROOT && !resolved.startsWith(`${WORKSPACE_ROOT}/`)) {
    return { ok: false, reason: `${JSON.stringify(input)} is outside ${WORKSPACE_ROOT}` };
  }
  return { ok: true, path: resolved };
}

/** Shell syntax that chains, redirects or substitutes: a command using any of it is never a plain read. */
const SHELL_COMPOSITION = /[;&|<>`\n\r]|\$\(/;

/**
 * An exec is a read only when the agent declared its program read-only and the command is
 * that one program with arguments: `sleep 5` may be a read, `sleep 5; rm -rf x` never is.
 */
export function execEffect(command: string, grant: ToolGrant | undefined): ToolEffect {
  const readOnly = grant?.readOnlyCommands ?? [];
  if (readOnly.length === 0 || SHELL_COMPOSITION.test(command)) return "write";
  const program = command.trim().split(/\s+/)[0] ?? "";
  return program !== "" && readOnly.includes(program) ? "read" : "write";
}

// Redaction lives in redaction.ts; re-exported so sandbox code keeps one import.
export {
  createStreamRedactor,
  grantedSecrets,
  redactionMarker,
  redactOutputTail,
  redactSecrets,
  storableText,
  type GrantedSecret,
  type ObservationText,
  type StreamRedactor,
} from "./redaction.js";
