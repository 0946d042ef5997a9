// The environment an exec runs with, checked the same way by both backends.
import { WorkspaceError } from "./workspace-backend.js";

/** Validates and merges environments: later ones win. Names must be non-empty, without "=" or NUL. */
export function mergeEnv(...sources: readonly Readonly<Record<string, string>>[]): Record<string, string> {
  const merged: Record<string, string> = {};
  for (const source of sources) {
    for (const [key, value] of Object.entries(source)) {
      if (key === "" || key.includes("=") || key.includes("\0") || value.includes("\0")) {
        throw new WorkspaceError("backend_failure", `invalid environment variable ${JSON.stringify(key)}`);
      }
      merged[key] = value;
    }
  }
  return merged;
}
