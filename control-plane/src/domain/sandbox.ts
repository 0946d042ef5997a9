// Sandbox rules in domain terms: where a workspace path may point, which commands count as
// reads, and how granted secrets are kept out of everything Keel stores or logs.

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

// Which execs count as reads lives in exec-effect.ts; re-exported for the sandbox tools.
export { execEffect } from "./exec-effect.js";

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
