// Tool policy, checked twice: once when deciding what to offer the model, and again for every
// call it asks for. AllowAll lets every trusted, registered tool through; budgets, cancellation,
// durable intent and the audit trail still apply to those calls, they are enforced elsewhere.
//
// Restriction semantics (each list is an independent filter):
//   - allowedTools: a tool passes when its full name ("ns.name.vN") or its unversioned name
//     ("ns.name") is listed. An EMPTY list places no restriction on tool names.
//   - allowedEffects: a tool passes when its declared effect is listed. An EMPTY list places no
//     restriction on effects.
//   - pathRules: at dispatch only. For every rule whose `field` appears in the call's arguments,
//     the value must be a string or an array of strings, and each path, once normalized, must equal
//     one of the rule's (normalized) prefixes or sit beneath it. A rule with no prefixes admits no
//     path. Fields that are absent from the arguments are not checked.
import type { Policy, ToolEffect } from "./agent.js";

export interface ToolFacts {
  /** "ns.name.vN" */
  readonly fullName: string;
  readonly effect: ToolEffect;
}

export type PolicyDecision = { readonly allowed: true } | { readonly allowed: false; readonly reason: string };

const ALLOWED: PolicyDecision = { allowed: true };

/** Where relative paths in tool arguments are anchored. */
export const WORKSPACE_ROOT = "/workspace";

function refuse(reason: string): PolicyDecision {
  return { allowed: false, reason };
}

/** "ns.name.v3" → "ns.name"; a name without a trailing version segment is returned unchanged. */
export function unversionedToolName(fullName: string): string {
  const match = /^(.+)\.v\d+$/.exec(fullName);
  return match?.[1] ?? fullName;
}

/** At advertisement: may this tool be offered at all? (tool and effect rules only) */
export function mayAdvertise(policy: Policy, tool: ToolFacts): PolicyDecision {
  if (policy.kind === "allow_all") return ALLOWED;

  if (policy.allowedTools.length > 0) {
    const bare = unversionedToolName(tool.fullName);
    const listed = policy.allowedTools.some((name) => name === tool.fullName || name === bare);
    if (!listed) {
      return refuse(`tool "${tool.fullName}" is not among the allowed tools (${policy.allowedTools.join(", ")})`);
    }
  }

  if (policy.allowedEffects.length > 0 && !policy.allowedEffects.includes(tool.effect)) {
    return refuse(
      `tool "${tool.fullName}" has the ${tool.effect} effect, and only ${policy.allowedEffects.join(", ")} tools are allowed`,
    );
  }

  return ALLOWED;
}

/** At dispatch: tool, effect, and every configured path field in the arguments. */
export function mayDispatch(
  policy: Policy,
  tool: ToolFacts,
  args: Readonly<Record<string, unknown>>,
): PolicyDecision {
  const advertised = mayAdvertise(policy, tool);
  if (!advertised.allowed || policy.kind === "allow_all") return advertised;

  for (const rule of policy.pathRules) {
    if (!Object.prototype.hasOwnProperty.call(args, rule.field)) continue;
    const value = args[rule.field];
    if (value === undefined) continue;

    let paths: readonly string[];
    if (typeof value === "string") {
      paths = [value];
    } else if (Array.isArray(value) && value.every((item): item is string => typeof item === "string")) {
      paths = value;
    } else {
      return refuse(
        `path field "${rule.field}" of tool "${tool.fullName}" must be a string or a list of strings, but it is ${describeValueType(value)}`,
      );
    }

    const prefixes = rule.prefixes.map(normalizePosixPath);
    for (const raw of paths) {
      if (raw.includes("\0")) {
        return refuse(`path field "${rule.field}" of tool "${tool.fullName}" contains a NUL character`);
      }
      const path = normalizePosixPath(raw);
      if (prefixes.some((prefix) => isAtOrUnder(path, prefix))) continue;
      const shown = path === raw ? `"${raw}"` : `"${raw}" (which resolves to "${path}")`;
      const allowed = prefixes.length === 0 ? "no prefixes, so no path is allowed" : prefixes.join(", ");
      return refuse(`path field "${rule.field}" value ${shown} is outside the allowed prefixes ${allowed}`);
    }
  }

  return ALLOWED;
}

/**
 * Lexical POSIX normalization, with no filesystem access: collapses repeated slashes, drops ".",
 * resolves ".." (never above "/"), removes a trailing slash, and anchors relative paths (including
 * the empty string) at /workspace.
 */
export function normalizePosixPath(path: string): string {
  const absolute = path.startsWith("/") ? path : `${WORKSPACE_ROOT}/${path}`;
  const out: string[] = [];
  for (const segment of absolute.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") out.pop();
    else out.push(segment);
  }
  return `/${out.join("/")}`;
}

/** Both arguments must already be normalized. "/workspace/a" is not under "/workspace/ab". */
function isAtOrUnder(path: string, prefix: string): boolean {
  if (path === prefix) return true;
  return path.startsWith(prefix === "/" ? "/" : `${prefix}/`);
}

function describeValueType(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "a list containing non-string items";
  return `a ${typeof value}`;
}
